//! The commands the server runs once a request is admitted: hello, ping, the in-memory CRUD
//! commands (TK-*), `configureFailPoint` and a few no-ops. A command the server does not know
//! (`refusals::known_command`) was answered with `CommandNotFound` (59) before it was admitted; a
//! known one [`execute`] does not run is `TestkitUnsupported` (TK-2).

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};

use crate::config::{
    Role, LOGICAL_SESSION_TIMEOUT_MINUTES, MAX_BSON_OBJECT_SIZE, MAX_MESSAGE_SIZE_BYTES,
    MAX_WRITE_BATCH_SIZE,
};
use crate::fail_point::{error_reply, FailCommand, TESTKIT_UNSUPPORTED};
use crate::on_primary_write::OnPrimaryWrite;
use crate::refusals::ApiParameters;
use crate::server::State;
use crate::store::{AsSent, Batch, CursorOrigin, DdlTarget, QueryError, Store, WriteKey};
use retry_core::wire::OpMsg;

/// The `electionId` a primary reports; constant, since the test server never holds an election.
const ELECTION_ID: [u8; 12] = [0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 1];

/// The server version `buildInfo` reports for a `maxWireVersion` (TK-*: consistent with hello):
/// 25 is 8.0, 21 is 7.0, 17 is 6.0, 13 is 5.0, 9 is 4.4, 8 is 4.2.
pub(crate) fn version_for_wire(max_wire_version: i32) -> [i32; 3] {
    match max_wire_version {
        v if v >= 27 => [8, 2, 0],
        26 => [8, 1, 0],
        25 => [8, 0, 0],
        22..=24 => [7, v_minor(max_wire_version, 21), 0],
        21 => [7, 0, 0],
        18..=20 => [6, v_minor(max_wire_version, 17), 0],
        17 => [6, 0, 0],
        14..=16 => [5, v_minor(max_wire_version, 13), 0],
        13 => [5, 0, 0],
        9..=12 => [4, 4, 0],
        8 => [4, 2, 0],
        7 => [4, 0, 0],
        6 => [3, 6, 0],
        _ => [3, 4, 0],
    }
}

/// The rapid releases between majors: one wire version each.
fn v_minor(max_wire_version: i32, major_wire: i32) -> i32 {
    max_wire_version - major_wire
}

/// Whether `name` is a handshake command: never rate limited (BP-6), recorded for tests.
pub(crate) fn is_hello(name: &str) -> bool {
    matches!(name, "hello" | "isMaster" | "ismaster")
}

/// A retryable write as the server sees it: a command with a `txnNumber` outside a
/// multi-document transaction, or a transaction's commit or abort.
pub(crate) fn is_retryable_write(name: &str, command: &Document) -> bool {
    matches!(name, "commitTransaction" | "abortTransaction")
        || (command.contains_key("txnNumber") && !command.contains_key("autocommit"))
}

/// The identity of a retryable write (`insert`, `update`, `delete`, `findAndModify`), when it
/// is one: a retry with the same `lsid`, `txnNumber` and statement gets the first reply and does
/// not run again (TK-*). Statements are numbered by their position from 0, as a real server
/// numbers those of a driver's write, which sends no `stmtId` (the test server refuses one,
/// [`ENVELOPE`]). The key is the first statement's (`stmtId` 0): for `insert`,
/// `findAndModify` and `bulkWrite` it stands for the whole command; `update` and `delete` key
/// each statement by its index instead (review15 finding 4, `server::statement_writes`).
pub(crate) fn write_key(name: &str, command: &Document) -> Option<WriteKey> {
    let write = matches!(
        name,
        "insert" | "update" | "delete" | "findAndModify" | "bulkWrite"
    );
    if !write || !is_retryable_write(name, command) {
        return None;
    }
    let session = command.get_document("lsid").ok()?.to_vec().ok()?;
    let txn_number = command.get("txnNumber").and_then(integer)?;
    Some(WriteKey {
        session,
        txn_number,
        stmt_id: 0,
    })
}

/// What a hello reply depends on besides the server's state.
pub(crate) struct HelloContext<'a> {
    /// The server's `host:port`, for `me`.
    pub(crate) me: &'a str,
    /// `topologyVersion.processId`.
    pub(crate) process_id: ObjectId,
    /// The `serviceId` a load balancer reports for this connection (LB-17): the process id, or
    /// with several services behind it, the one the connection was routed to.
    pub(crate) service_id: ObjectId,
    /// The connection's id.
    pub(crate) connection_id: i32,
    /// `minWireVersion`.
    pub(crate) min_wire_version: i32,
    /// `maxWireVersion`.
    pub(crate) max_wire_version: i32,
}

/// What of a hello request its reply depends on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct HelloAsk {
    /// `helloOk: true` was sent.
    pub(crate) hello_ok: bool,
    /// `loadBalanced: true` was sent.
    pub(crate) load_balanced: bool,
}

impl HelloAsk {
    /// The fields of a decoded hello.
    pub(crate) fn of(command: &Document) -> HelloAsk {
        HelloAsk {
            hello_ok: matches!(command.get("helloOk"), Some(Bson::Boolean(true))),
            load_balanced: matches!(command.get("loadBalanced"), Some(Bson::Boolean(true))),
        }
    }
}

/// LB-7 under a strict Stable API: a server parses its hello's fields with the request's
/// `apiStrict`, and `loadBalanced` is an unstable field of the hello command (the server's
/// hello.idl, `stability: unstable`): present with any value under `apiStrict: true`, the hello is
/// APIStrictError (323) with the IDL parser's message (its context is named "hello" for the
/// legacy names too, which `apiStrict: true` refuses earlier anyway). Checked when the hello runs
/// (its parse is part of running it), after admission and the fail point.
pub(crate) fn hello_refusal(command: &Document) -> Option<Document> {
    let strict = matches!(command.get("apiStrict"), Some(Bson::Boolean(true)));
    (strict && command.contains_key("loadBalanced")).then(|| {
        crate::fail_point::error_reply(
            323,
            "BSON field 'hello.loadBalanced' is not allowed with apiStrict:true.",
        )
    })
}

/// HS-3, HS-4, LB-8: the reply to `hello` / legacy hello in `role`.
///
/// `isWritablePrimary` answers `hello` and `ismaster` answers legacy hello; `helloOk: true` only
/// when the request carried it. A load balancer adds `serviceId` only when the request carried
/// `loadBalanced: true` and its `service_id` switch is on.
pub(crate) fn hello_reply(
    name: &str,
    ask: HelloAsk,
    role: &Role,
    topology_counter: i64,
    context: &HelloContext<'_>,
) -> Document {
    let writable = match role {
        Role::ReplicaSetMember(member) => member.primary,
        Role::Standalone | Role::Mongos | Role::LoadBalancer { .. } => true,
    };
    let mut reply = if name == "hello" {
        doc! { "isWritablePrimary": writable }
    } else {
        doc! { "ismaster": writable }
    };
    if ask.hello_ok {
        reply.insert("helloOk", true);
    }
    reply.insert(
        "topologyVersion",
        doc! { "processId": context.process_id, "counter": topology_counter },
    );
    match role {
        Role::Standalone => {}
        Role::Mongos => {
            reply.insert("msg", "isdbgrid");
        }
        Role::LoadBalancer { service_id } => {
            reply.insert("msg", "isdbgrid");
            if *service_id && ask.load_balanced {
                reply.insert("serviceId", context.service_id);
            }
        }
        Role::ReplicaSetMember(member) => {
            let hosts = if member.hosts.is_empty() {
                vec![context.me.to_owned()]
            } else {
                member.hosts.clone()
            };
            reply.insert("setName", member.set_name.as_str());
            reply.insert("setVersion", 1);
            reply.insert("secondary", !member.primary);
            reply.insert("hosts", hosts);
            reply.insert("me", context.me);
            if member.primary {
                reply.insert("primary", context.me);
                reply.insert("electionId", ObjectId::from_bytes(ELECTION_ID));
            } else if let Some(primary) = &member.primary_host {
                reply.insert("primary", primary.as_str());
            }
        }
    }
    reply.insert("maxBsonObjectSize", MAX_BSON_OBJECT_SIZE);
    reply.insert("maxMessageSizeBytes", MAX_MESSAGE_SIZE_BYTES);
    reply.insert("maxWriteBatchSize", MAX_WRITE_BATCH_SIZE);
    reply.insert(
        "logicalSessionTimeoutMinutes",
        LOGICAL_SESSION_TIMEOUT_MINUTES,
    );
    reply.insert("connectionId", context.connection_id);
    reply.insert("minWireVersion", context.min_wire_version);
    reply.insert("maxWireVersion", context.max_wire_version);
    reply.insert("readOnly", false);
    reply.insert("ok", 1.0);
    reply
}

/// Runs an admitted, non-hello command. `None` when the server does not know the command.
/// `ddl`: the pending number of the DDL command taking its turn, when it is one (TK-15).
/// `as_sent`: its documents to insert as they were sent, where known (review34 Y8;
/// [`Context::as_sent`]).
pub(crate) fn execute(
    state: &mut State,
    name: &str,
    request: &OpMsg,
    max_wire_version: i32,
    process_id: ObjectId,
    ddl: Option<u64>,
    as_sent: &[Option<AsSent>],
) -> Option<Document> {
    if name == "configureFailPoint"
        && request.body.get_str(name).ok() == Some("onPrimaryTransactionalWrite")
    {
        if state.role.is_router() {
            return Some(error_reply(
                2,
                "onPrimaryTransactionalWrite is a mongod fail point",
            ));
        }
        return Some(match OnPrimaryWrite::from_command(&request.body) {
            Ok(fail) => {
                state.on_primary_write = fail;
                ok()
            }
            Err(e) => error_reply(2, &e.to_string()),
        });
    }
    if name == "configureFailPoint" {
        return Some(match FailCommand::from_command(&request.body) {
            Ok(fail) => {
                state.fail_point = fail;
                ok()
            }
            Err(e) => error_reply(2, &e.to_string()),
        });
    }
    if name == "setParameter" {
        let required = &mut state.require_api_version;
        return Some(crate::parameters::set_parameter(required, &request.body));
    }
    if state.role == Role::Standalone && request.body.contains_key("txnNumber") {
        return Some(error_reply(
            20,
            "Transaction numbers are only allowed on a replica set member or mongos",
        ));
    }
    let data = state.data.clone();
    let mut store = data.lock();
    let in_transaction = request.body.get("autocommit") == Some(&Bson::Boolean(false));
    let ends = matches!(name, "commitTransaction" | "abortTransaction");
    // TK-12: a mongos keeps its own router state for the transactions it started.
    let router = state.role.is_router();
    let router_id = router.then_some(process_id);
    if !in_transaction && !ends {
        // TK-15 (review7 gap b): a write outside any transaction is a commit of its own.
        store.begin_statement(None);
    }
    if in_transaction && !ends {
        match transaction_command(&mut store, &request.body, router_id) {
            // TK-15: the statement reads and writes as its transaction.
            Ok(session) => store.begin_statement(Some(session)),
            Err((code, message)) => {
                let mut reply = error_reply(code, &message);
                if let Some(labels) = transaction_labels(name, code) {
                    reply.insert("errorLabels", labels);
                }
                return Some(reply);
            }
        }
    }
    // SE-14, TK-15: a cursor remembers the session, transaction and API parameters it was
    // opened with.
    let origin = CursorOrigin {
        owner: process_id,
        lsid: request.body.get_document("lsid").ok(),
        txn_number: request
            .body
            .get("txnNumber")
            .and_then(integer)
            .filter(|_| in_transaction),
        api: ApiParameters::of(&request.body),
        router: state.role.is_router(),
    };
    let refused = in_transaction
        .then(|| transaction_read_concern_refusal(&store, name, &request.body))
        .flatten();
    let mut context = Context {
        store: &mut store,
        batch_size: state.batch_size,
        origin,
        router: router_id,
        as_sent,
    };
    context.store.set_running_ddl(ddl);
    let reply = match refused {
        Some(refusal) => Some(refusal),
        None => run(&mut context, name, request, max_wire_version),
    };
    store.set_running_ddl(None);
    store.end_statement();
    let mut reply = reply?;
    // TK-15 (house rule 7): a statement that fails (an error or a write error) aborts its
    // transaction on a real server; its later commands get NoSuchTransaction (251).
    let failed = statement_failed(&reply);
    // TK-7, TK-15: a statement's WriteConflict (112), a commit's NoSuchTransaction (251), ...
    // are a TransientTransactionError.
    if in_transaction && !reply.contains_key("errorLabels") {
        if let Some(labels) = reply
            .get("code")
            .and_then(integer)
            .and_then(|code| transaction_labels(name, i32::try_from(code).ok()?))
        {
            reply.insert("errorLabels", labels);
        }
    }
    if in_transaction && !ends && failed {
        let session = request
            .body
            .get_document("lsid")
            .ok()
            .and_then(|l| l.to_vec().ok());
        if let (Some(session), Some(number)) =
            (session, request.body.get("txnNumber").and_then(integer))
        {
            store.abort_failed_statement(&session, number);
        }
    }
    // TK-15: a mongos answers every command of a transaction with a recovery token.
    let transactional = in_transaction || ends;
    if router && transactional {
        reply.insert("recoveryToken", doc! { "recoveryShardId": "shard0" });
    }
    Some(reply)
}

/// Leftovers12 item 1 (house rule 7): `create` and `createIndexes` in a transaction whose read
/// concern (its first command's) has a level other than "local": InvalidOptions (72), "Command
/// \<name\> does not support this transaction's { readConcern: ... } :: caused by :: read concern
/// not supported", as a mongod checks them (and only them) once it has checked the session out
/// (`service_entry_point_common`; behind a mongos, the shard does). The statement fails, so the
/// transaction is aborted.
fn transaction_read_concern_refusal(
    store: &Store,
    name: &str,
    command: &Document,
) -> Option<Document> {
    if !matches!(name, "create" | "createIndexes") {
        return None;
    }
    let session = command.get_document("lsid").ok()?.to_vec().ok()?;
    let read_concern = store.transaction_read_concern(&session)?;
    let level = read_concern.get_str("level").ok()?;
    (level != "local").then(|| {
        crate::refusals::read_concern_not_supported(
            &format!("Command {name} does not support this transaction's"),
            read_concern,
            "read concern not supported",
        )
    })
}

/// TK-15: whether a transaction's statement failed (an error or a write error), which aborts
/// the transaction; `ok` is read by the one rule of `retry_core::reply` (review7 finding 5).
fn statement_failed(reply: &Document) -> bool {
    !retry_core::reply::is_ok(reply) || reply.contains_key("writeErrors")
}

/// TK-15: checks (and with `startTransaction: true`, starts) the transaction a command with
/// `autocommit: false` belongs to, on `router` (a mongos); its session (lsid bytes).
fn transaction_command(
    store: &mut Store,
    command: &Document,
    router: Option<ObjectId>,
) -> Result<Vec<u8>, (i32, String)> {
    let session = command
        .get_document("lsid")
        .ok()
        .and_then(|l| l.to_vec().ok());
    let number = command.get("txnNumber").and_then(integer);
    let (Some(session), Some(number)) = (session, number) else {
        return Err((
            50768,
            "a command with autocommit: false needs lsid and txnNumber".into(),
        ));
    };
    let start = command.get("startTransaction") == Some(&Bson::Boolean(true));
    store.transaction_command(session.clone(), number, start, router)?;
    if start {
        let read_concern = command.get_document("readConcern").ok().cloned();
        store.note_transaction_start(&session, ApiParameters::of(command), read_concern);
    }
    Ok(session)
}

/// Versioned-api "Transactions" (house rule 7): a command (known: unknown ones are 59 first), with an `lsid` and
/// a `txnNumber`, refused with APIMismatchError (347) when its API parameters are not those of
/// its session's transaction in progress ([`Store::transaction_api_mismatch`]). Checked when a
/// real server checks the session out: before a retryable write's replay or its aborting of
/// an older transaction, before the transaction's own checks, commit and abort included.
pub(crate) fn transaction_api_refusal(
    state: &State,
    name: &str,
    command: &Document,
    process_id: ObjectId,
) -> Option<Document> {
    let number = command.get("txnNumber").and_then(integer)?;
    let session = command.get_document("lsid").ok()?.to_vec().ok()?;
    let router = state.role.is_router();
    let api = ApiParameters::of(command);
    let store = state.data.lock();
    let router = router.then_some(process_id);
    let (code, message) = store.transaction_api_mismatch(&session, number, api, name, router)?;
    Some(error_reply(code, &message))
}

/// TK-7: the `TransientTransactionError` label a server adds to an error of a transaction's
/// command: 24, 91, 10107, 112 and 251 on its statements, 24 and 251 on `commitTransaction`;
/// `None` for anything else (e.g. 11601, 50, 51).
pub(crate) fn transaction_labels(name: &str, code: i32) -> Option<Vec<String>> {
    let transient = match name {
        "commitTransaction" => matches!(code, 24 | 251),
        "abortTransaction" => false,
        _ => matches!(code, 24 | 91 | 10107 | 112 | 251),
    };
    transient.then(|| vec![String::from("TransientTransactionError")])
}

/// TK-15 (leftovers11, leftovers12 item 5, review15 finding 1): the pending-DDL checks for one
/// collection `ns` a command locks, as it locks it: a transaction that does not hold it yet
/// cannot get it while a DDL command waits for it (LockTimeout 24, [`Store::lock_timeout`]);
/// a command outside any queues behind such a DDL command ([`Store::ddl_queue`]; `ddl`: it is
/// a DDL command itself, pending in its turn).
fn pending_ddl_refusal(store: &mut Store, ns: &str, ddl: bool) -> Option<Document> {
    if !store.ddl_pending() {
        return None;
    }
    if let Some((code, message)) = store.lock_timeout(ns) {
        return Some(error_reply(code, &message));
    }
    let target = if ddl {
        store.collection_ddl_target(ns)
    } else {
        DdlTarget::Collection(ns.to_owned())
    };
    store.ddl_queue(&target, ddl).err().map(query_error)
}

/// TK-15 (review16 finding 2, house rule 7): the commands on the collection their first field
/// names that take that collection's exclusive lock (MODE_X, with the database's MODE_IX) on a
/// 4.4+ server, so that, queued behind a pending DDL command, they hold their place against
/// later ones as a DDL command does: `drop` (`drop_collection.cpp`), `create`
/// (`create_collection.cpp`), `dropIndexes` (`drop_indexes.cpp`: MODE_IX first, to abort index
/// builds, then MODE_X), and `createIndexes`, whose index build starts and commits under the
/// collection's MODE_X (`index_builds_coordinator.cpp`; it scans in between under an intent
/// lock). The test server runs each as one step in its first place (docs/testkit.md, Limits).
const EXCLUSIVE_COMMANDS: [&str; 4] = ["drop", "create", "createIndexes", "dropIndexes"];

/// The wire version of MongoDB 5.0, the first release whose reads outside a transaction are
/// lock-free.
const LOCK_FREE_READS_WIRE_VERSION: i32 = 13;

/// TK-15 (fixes15c, house rule 7): whether `name`, run outside a transaction on a server of
/// `max_wire_version`, reads the collection its first field names without that collection's
/// lock, so it does not queue behind a DDL command pending there and reads the documents as they
/// are before it. From 5.0 (wire 13) `find`, `count`, `distinct`, `listIndexes` and an
/// `aggregate`'s source collection (a `$out` / `$merge` target is locked on its own, as a write)
/// take `AutoGetCollectionForReadCommandMaybeLockFree` (the server's `find_cmd.cpp`,
/// `count_cmd.cpp`, `distinct.cpp`, `list_indexes.cpp`, `run_aggregate.cpp`), which is lock-free
/// outside a multi-document transaction (`db_raii.cpp`, `supportsLockFreeRead`; 4.4 and older
/// take the collection's IS lock, which queues behind a waiting X). A `$changeStream` locks the
/// oplog instead of the collection it watches (`run_aggregate.cpp`), on every version.
fn reads_without_collection_lock(name: &str, command: &Document, max_wire_version: i32) -> bool {
    let change_stream = name == "aggregate"
        && command
            .get_array("pipeline")
            .ok()
            .and_then(|stages| stages.first())
            .and_then(Bson::as_document)
            .is_some_and(|stage| stage.contains_key("$changeStream"));
    let lock_free = matches!(
        name,
        "find" | "count" | "distinct" | "listIndexes" | "aggregate"
    );
    change_stream || (lock_free && max_wire_version >= LOCK_FREE_READS_WIRE_VERSION)
}

/// What a data command works on: the (possibly shared) store, locked once for the command, and
/// the server's default batch size.
struct Context<'a> {
    store: &'a mut Store,
    batch_size: u32,
    /// The server process running the command (its cursors stay with it, TK-12) and the
    /// command's session and transaction (SE-14).
    origin: CursorOrigin<'a>,
    /// TK-12: the mongos running the command, `None` off a mongos (see
    /// [`Store::end_transaction`]).
    router: Option<ObjectId>,
    /// Review34 Y8: each document to insert as it was sent (its size, a key sent twice counting
    /// twice; whether `_id` is sent twice), by its position in `documents` (an `insert`) or
    /// `ops` (a `bulkWrite`), read from the request as it arrived; empty or `None` where not
    /// known (`store::insert_refusal` then encodes the document).
    as_sent: &'a [Option<AsSent>],
}

/// Runs a data command; `None` for a command the test server knows but does not run
/// ([`KNOWN_NOT_RUN`]).
fn run(
    state: &mut Context<'_>,
    name: &str,
    request: &OpMsg,
    max_wire_version: i32,
) -> Option<Document> {
    let command = &request.body;
    let db = command.get_str("$db").unwrap_or_default();
    let before_4_2 = max_wire_version < COLLECTION_DDL_LOCKS_WIRE_VERSION;
    state.store.set_collection_ddl_locks_database(before_4_2);
    if let Ok(lsid) = command.get_document("lsid") {
        state.store.note_session(lsid);
    }
    if let Some(refusal) = unknown_field(name, command) {
        return Some(refusal);
    }
    // TK-15 (leftovers11, leftovers12 item 5): a command on the collection its first field
    // names, before it reads or writes anything. The namespaces a command locks otherwise are
    // checked where it locks them (fixes15a, review15 finding 1): each `bulkWrite` op's
    // `nsInfo` entry ([`bulk_write`]), a `$out` / `$merge` target (`Store::replace_collection`,
    // `Store::merge`); `{aggregate: 1}` and `getMore` lock none here ([`aggregate`],
    // [`get_more`]); a read outside a transaction that takes no collection lock
    // ([`reads_without_collection_lock`]) has no check.
    let outside_transaction = state.origin.txn_number.is_none();
    let lock_free =
        outside_transaction && reads_without_collection_lock(name, command, max_wire_version);
    if let Some(collection) = command.get_str(name).ok().filter(|_| !lock_free) {
        let ns = format!("{db}.{collection}");
        let ddl = EXCLUSIVE_COMMANDS.contains(&name);
        if let Some(refusal) = pending_ddl_refusal(state.store, &ns, ddl) {
            return Some(refusal);
        }
    }
    Some(match name {
        "ping" | "endSessions" => ok(),
        // UT-25, TK-15 (review8 finding 3): killing sessions aborts their transactions; an
        // empty list kills all of them (no users: every session is the caller's).
        "killAllSessions" | "killSessions" => match command.get(name) {
            Some(Bson::Array(patterns)) if patterns.is_empty() => {
                state.store.kill_sessions(None);
                ok()
            }
            Some(Bson::Array(sessions)) if name == "killSessions" => {
                let sessions: Option<Vec<Vec<u8>>> = sessions
                    .iter()
                    .map(|s| s.as_document().and_then(|d| d.to_vec().ok()))
                    .collect();
                match sessions {
                    Some(sessions) => {
                        state.store.kill_sessions(Some(&sessions));
                        ok()
                    }
                    None => error_reply(14, "killSessions takes an array of session ids"),
                }
            }
            Some(Bson::Array(_)) => unsupported_reply("killAllSessions with user patterns"),
            _ => error_reply(14, &format!("{name} must be an array")),
        },
        "buildInfo" | "buildinfo" => {
            let [major, minor, patch] = version_for_wire(max_wire_version);
            doc! {
            "version": format!("{major}.{minor}.{patch}"),
            "versionArray": [major, minor, patch, 0],
            "maxBsonObjectSize": MAX_BSON_OBJECT_SIZE,
            "ok": 1.0,
            }
        }
        "insert" => insert(state, db, request),
        "update" => update(state, db, request),
        "delete" => delete(state, db, request),
        "findAndModify" => find_and_modify(state, db, command),
        // TK-1, TK-14: the client bulk write command of MongoDB 8.0 (wire 25).
        "bulkWrite" if max_wire_version >= 25 => bulk_write(state, db, request),
        "count" => count(state, db, command),
        "distinct" => distinct(state, db, command),
        "aggregate" => aggregate(state, db, command, max_wire_version),
        // Review34 Y4: `create` checks the namespace (`userAllowedCreateNS`) and creates the
        // database (`openDb`; on a router, the config server) before the collection.
        "create" => match collection_name(command, "create") {
            Ok(c) => {
                let ns = format!("{db}.{c}");
                match creation_ns_refusal(state, &ns) {
                    Some(refusal) => refusal,
                    None if state.store.create(&ns) => ok(),
                    None => error_reply(48, &format!("Collection {ns} already exists.")),
                }
            }
            Err(e) => e,
        },
        // TK-15: outside a transaction (in one both are 263), both wait for one holding what
        // they drop (review12 finding 1).
        "drop" => match collection_name(command, "drop") {
            Ok(c) => match state.store.drop_collection(&format!("{db}.{c}")) {
                Ok(true) => ok(),
                Ok(false) => error_reply(26, &format!("ns not found: {db}.{c}")),
                Err(e) => query_error(e),
            },
            Err(e) => e,
        },
        "dropDatabase" => match state.store.drop_database(db) {
            Ok(()) => ok(),
            Err(e) => query_error(e),
        },
        "listCollections" => list_collections(state, db, command, max_wire_version),
        "listDatabases" => {
            let names = state.store.database_names();
            let dbs: Vec<Document> = names
                .into_iter()
                .map(|n| doc! { "name": n, "sizeOnDisk": 8192_i64, "empty": false })
                .collect();
            let dbs = match filtered(dbs, command.get("filter")) {
                Ok(d) => d,
                Err(e) => return Some(e),
            };
            // After the filter is parsed, as the server parses it before any lock.
            if let Some(refusal) = list_databases_queue(state.store, command, max_wire_version) {
                return Some(refusal);
            }
            if command.get_bool("nameOnly").unwrap_or(false) {
                let names: Vec<Document> = dbs
                    .into_iter()
                    .map(|d| doc! { "name": d.get("name").cloned().unwrap_or(Bson::Null) })
                    .collect();
                doc! { "databases": names, "ok": 1.0 }
            } else {
                doc! { "databases": dbs, "totalSize": 0_i64, "ok": 1.0 }
            }
        }
        "listIndexes" => match (
            collection_name(command, "listIndexes"),
            cursor_batch_size(command, state.batch_size),
        ) {
            (Ok(c), Ok(batch_size)) => {
                let ns = format!("{db}.{c}");
                if !state.store.collection_names(db).iter().any(|n| n == c) {
                    return Some(error_reply(26, &format!("ns does not exist: {ns}")));
                }
                let indexes = state.store.indexes(&ns);
                let batch = state
                    .store
                    .open_cursor(state.origin, &ns, indexes, batch_size);
                cursor_reply("firstBatch", &ns, batch)
            }
            (Err(e), _) | (_, Err(e)) => e,
        },
        "createIndexes" => create_indexes(state, db, command),
        "dropIndexes" | "deleteIndexes" => match collection_name(command, name) {
            Ok(c) => match command.get("index") {
                Some(Bson::String(index)) => {
                    match state.store.drop_index(&format!("{db}.{c}"), index) {
                        Ok(()) => ok(),
                        Err((code, message)) => error_reply(code, &message),
                    }
                }
                _ => unsupported_reply("dropIndexes with an index other than a name or \"*\""),
            },
            Err(e) => e,
        },
        "commitTransaction" | "abortTransaction" => {
            if db != "admin" {
                return Some(error_reply(
                    13,
                    &format!("{name} may only be run against the admin database."),
                ));
            }
            let session = command
                .get_document("lsid")
                .ok()
                .and_then(|l| l.to_vec().ok());
            let number = command.get("txnNumber").and_then(integer);
            let (Some(session), Some(number)) = (session, number) else {
                return Some(error_reply(
                    50768,
                    &format!("{name} must be run within a transaction"),
                ));
            };
            let commit = name == "commitTransaction";
            // Review8 finding 2, TX-6: a mongos recovers a decision only with the token.
            let token = command.get_document("recoveryToken").is_ok();
            match state
                .store
                .end_transaction(&session, number, commit, state.router, token)
            {
                Ok(()) => ok(),
                Err((code, message)) => error_reply(code, &message),
            }
        }
        "find" => find(state, db, command),
        "getMore" => get_more(state, db, command, max_wire_version),
        "killCursors" => kill_cursors(state, db, command),
        name if KNOWN_NOT_RUN.contains(&name) => return None,
        // Never reached by a client: an unknown command was CommandNotFound (59) before, and
        // the other known ones run in other handlers (review13 finding 2's test keeps them in
        // step); loud all the same (TK-2).
        _ => unsupported_reply(&format!("command {name} without a handler")),
    })
}

/// TK-2: a real server's commands the test server knows but does not run. They are admitted
/// like any command (authentication, API parameters and fail points apply; a failCommand fail
/// point naming one fires, as the retryable-reads `mapReduce` tests expect), then [`run`]
/// answers `None` for them, which its caller answers TestkitUnsupported, logged.
pub(crate) const KNOWN_NOT_RUN: &[&str] = &[
    "collMod",
    "mapReduce",
    "renameCollection",
    "replSetFreeze",
    "replSetStepDown",
];

pub(crate) fn ok() -> Document {
    doc! { "ok": 1.0 }
}

/// The collection a command names in its first field, or an error reply.
fn collection_name<'a>(command: &'a Document, field: &str) -> Result<&'a str, Document> {
    command
        .get_str(field)
        .map_err(|_| error_reply(2, &format!("{field} needs a collection name")))
}

/// The namespace an `insert`, `update` or `delete` (`command`) on `db` writes to, and the
/// documents or statements of its array `field`.
fn write_target(
    request: &OpMsg,
    db: &str,
    command: &str,
    field: &str,
) -> Result<(String, Vec<Document>), Document> {
    let collection = collection_name(&request.body, command)?;
    Ok((format!("{db}.{collection}"), documents_of(request, field)?))
}

/// Review34 Y4 (house rule 7): the command's refusal of a write to `ns` before it runs: a `$` in
/// the database's name (`database_name::write_refusal`), and on a router, a database it would
/// have to create and may not (`Store::creation_refusal`: its write targeter creates the
/// database first, whatever the write).
fn write_ns_refusal(state: &mut Context<'_>, ns: &str) -> Option<Document> {
    let router = state.origin.router;
    crate::database_name::write_refusal(ns)
        .or_else(|| {
            router
                .then(|| state.store.creation_refusal(ns, true))
                .flatten()
        })
        .map(|(code, message)| error_reply(code, &message))
}

/// Review34 Y4 (house rule 7): the command's refusal of creating collection `ns` (`create`,
/// `createIndexes`, an upserting `findAndModify`): a `$` in the database's name, then a
/// database the server may not create (`Store::creation_refusal`).
fn creation_ns_refusal(state: &mut Context<'_>, ns: &str) -> Option<Document> {
    crate::database_name::write_refusal(ns)
        .or_else(|| state.store.creation_refusal(ns, state.origin.router))
        .map(|(code, message)| error_reply(code, &message))
}

/// The first field of `statement` that is not one of `allowed`.
fn field_not_in<'a>(statement: &'a Document, allowed: &[&str]) -> Option<&'a str> {
    statement
        .keys()
        .map(String::as_str)
        .find(|k| !allowed.contains(k))
}

/// The documents of array `field`, from the body or from a kind-1 sequence of that name.
fn documents_of(request: &OpMsg, field: &str) -> Result<Vec<Document>, Document> {
    let mut documents = Vec::new();
    if let Ok(array) = request.body.get_array(field) {
        for item in array {
            let Bson::Document(d) = item else {
                return Err(error_reply(2, &format!("{field} must hold documents")));
            };
            documents.push(d.clone());
        }
    }
    for sequence in &request.sequences {
        if sequence.identifier == field {
            documents.extend(sequence.documents.iter().cloned());
        }
    }
    Ok(documents)
}

/// TK-5, TK-11: an `update` or `delete` of several statements as one single-statement request
/// per statement, in order (each statement of a retryable write is deduplicated and fires
/// `onPrimaryTransactionalWrite` on its own); `None` for anything else.
pub(crate) fn statement_requests(name: &str, request: &OpMsg) -> Option<Vec<OpMsg>> {
    let field = match name {
        "update" => "updates",
        "delete" => "deletes",
        _ => return None,
    };
    let statements = documents_of(request, field).ok()?;
    if statements.len() < 2 {
        return None;
    }
    let mut body = request.body.clone();
    body.remove(field);
    Some(
        statements
            .into_iter()
            .map(|statement| {
                let mut body = body.clone();
                body.insert(field, vec![statement]);
                OpMsg {
                    body,
                    sequences: Vec::new(),
                    ..request.clone()
                }
            })
            .collect(),
    )
}

/// `ordered`, true unless the command says otherwise.
pub(crate) fn ordered(command: &Document) -> bool {
    !matches!(command.get("ordered"), Some(Bson::Boolean(false)))
}

fn count_i32(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// `{insert: coll, documents: [...], ordered}`; a duplicate `_id` is a write error 11000.
fn insert(state: &mut Context<'_>, db: &str, request: &OpMsg) -> Document {
    let (ns, documents) = match write_target(request, db, "insert", "documents") {
        Ok(target) => target,
        Err(e) => return e,
    };
    if let Some(refusal) = write_ns_refusal(state, &ns) {
        return refusal;
    }
    // Review34 Y4: on a mongod, each document that would create the collection, and with it a
    // database the server may not create, fails as it is inserted (`makeCollection` inside
    // each insert's error handling in `write_ops_exec.cpp`; a router refused it above).
    let mongod = !state.origin.router;
    let creation = mongod
        .then(|| state.store.creation_refusal(&ns, false))
        .flatten();
    let ordered = ordered(&request.body);
    // Review32 R4, review7 finding 3: a document over `maxBsonObjectSize` (BadValue, 2) or nested
    // deeper than a stored one may be (Overflow, 15) is refused as a write error
    // (`store::insert_refusal`); an ordered insert stops there.
    let mut errors: Vec<(usize, Document)> = Vec::new();
    let mut positions = Vec::new();
    let mut storable = Vec::new();
    for (index, document) in documents.into_iter().enumerate() {
        let sent = state.as_sent.get(index).copied().flatten();
        let refusal = crate::store::insert_refusal(&document, sent).or_else(|| creation.clone());
        if let Some((code, message)) = refusal {
            errors.push((index, doc! { "code": code, "errmsg": message }));
            if ordered {
                break;
            }
            continue;
        }
        positions.push(index);
        storable.push(document);
    }
    let outcome = match state.store.insert(&ns, storable, ordered) {
        Ok(outcome) => outcome,
        Err(e) => return query_error(e),
    };
    if ordered && !outcome.duplicates.is_empty() {
        // The duplicate came first: the ordered insert stopped there.
        errors.clear();
    }
    for (index, id) in outcome.duplicates {
        let message = crate::store::duplicate_key_message(&ns, &id);
        errors.push((positions[index], doc! { "code": 11000, "errmsg": message }));
    }
    errors.sort_by_key(|(index, _)| *index);
    let errors = errors
        .into_iter()
        .map(|(index, error)| {
            let mut entry = doc! { "index": count_i32(index) };
            entry.extend(error);
            entry
        })
        .collect();
    write_reply(doc! { "n": count_i32(outcome.n) }, errors)
}

/// A write command's reply: `counts`, then the statements' `writeErrors` when there are any,
/// then `ok: 1`.
fn write_reply(mut counts: Document, errors: Vec<Document>) -> Document {
    if !errors.is_empty() {
        counts.insert("writeErrors", errors);
    }
    counts.insert("ok", 1.0);
    counts
}

/// `{update: coll, updates: [{q, u, multi, upsert}], ordered}`.
fn update(state: &mut Context<'_>, db: &str, request: &OpMsg) -> Document {
    let (ns, statements) = match write_target(request, db, "update", "updates") {
        Ok(target) => target,
        Err(e) => return e,
    };
    if let Some(refusal) = write_ns_refusal(state, &ns) {
        return refusal;
    }
    let (mut n, mut modified, mut upserted, mut errors) = (0, 0, Vec::new(), Vec::new());
    for (index, statement) in statements.iter().enumerate() {
        if let Some(field) = field_not_in(statement, &["q", "u", "multi", "upsert"]) {
            return unsupported_reply(&format!("update statement field {field}"));
        }
        let (Ok(filter), Ok(update)) = (statement.get_document("q"), statement.get_document("u"))
        else {
            if matches!(statement.get("u"), Some(Bson::Array(_))) {
                return unsupported_reply("pipeline updates");
            }
            return error_reply(2, "each update needs q and u documents");
        };
        let multi = statement.get_bool("multi").unwrap_or(false);
        if multi && is_retryable_write("update", &request.body) {
            return error_reply(
                72,
                "Cannot use (or request) retryable writes with multi=true",
            );
        }
        let upsert = statement.get_bool("upsert").unwrap_or(false);
        // Review34 Y4: on a mongod, an upsert creating the collection, and with it a database
        // the server may not create, is the statement's write error (a router refused it
        // above).
        let creation = (upsert && !state.origin.router)
            .then(|| state.store.creation_refusal(&ns, false))
            .flatten();
        if let Some((code, message)) = creation {
            errors.push(doc! { "index": count_i32(index), "code": code, "errmsg": message });
            if ordered(&request.body) {
                break;
            }
            continue;
        }
        match state.store.update(&ns, filter, update, multi, upsert) {
            Ok(outcome) => {
                n += outcome.matched;
                modified += outcome.modified;
                if let Some(id) = outcome.upserted {
                    n += 1;
                    upserted.push(doc! { "index": count_i32(index), "_id": id });
                }
            }
            // Review7 finding 3: the statement's write error (Overflow, 15); an upsert of an
            // `_id` already there (DuplicateKey, 11000) or a change of an `_id` (ImmutableField,
            // 66) is one too.
            Err(error @ (QueryError::TooDeep | QueryError::Write(..))) => {
                let (code, message) = match error {
                    QueryError::Write(code, message) => (code, message),
                    _ => (
                        15,
                        format!(
                            "Document exceeds maximum nesting depth of {}",
                            crate::store::MAX_STORED_DEPTH
                        ),
                    ),
                };
                errors.push(doc! { "index": count_i32(index), "code": code, "errmsg": message });
                if ordered(&request.body) {
                    break;
                }
            }
            Err(e) => return query_error(e),
        }
    }
    let mut reply = doc! { "n": count_i32(n), "nModified": count_i32(modified) };
    if !upserted.is_empty() {
        reply.insert("upserted", upserted);
    }
    write_reply(reply, errors)
}

/// `{delete: coll, deletes: [{q, limit}], ordered}`.
fn delete(state: &mut Context<'_>, db: &str, request: &OpMsg) -> Document {
    let (ns, statements) = match write_target(request, db, "delete", "deletes") {
        Ok(target) => target,
        Err(e) => return e,
    };
    if let Some(refusal) = write_ns_refusal(state, &ns) {
        return refusal;
    }
    let mut n = 0;
    for statement in &statements {
        if let Some(field) = field_not_in(statement, &["q", "limit"]) {
            return unsupported_reply(&format!("delete statement field {field}"));
        }
        let Ok(filter) = statement.get_document("q") else {
            return error_reply(2, "each delete needs a q document");
        };
        let multi = statement.get("limit").and_then(integer) == Some(0);
        if multi && is_retryable_write("delete", &request.body) {
            return error_reply(72, "Cannot use (or request) retryable writes with limit=0");
        }
        match state.store.delete(&ns, filter, multi) {
            Ok(removed) => n += removed.len(),
            Err(e) => return query_error(e),
        }
    }
    doc! { "n": count_i32(n), "ok": 1.0 }
}

/// TK-14: `{bulkWrite: 1, ops, nsInfo, errorsOnly, ordered}` on `admin` (MongoDB 8.0): each op
/// `{insert: i, document}`, `{update: i, filter, updateMods, multi, upsert}` or
/// `{delete: i, filter, multi}` runs on `nsInfo[i].ns`; the per-op results come back in a cursor
/// (only the errors with `errorsOnly`) with the summary counts. An ordered bulk stops at its first
/// error. Op fields it does not evaluate (collation, hint, arrayFilters, sort) are refused (TK-2).
fn bulk_write(state: &mut Context<'_>, db: &str, request: &OpMsg) -> Document {
    if db != "admin" {
        return error_reply(13, "bulkWrite may only be run against the admin database.");
    }
    let (ops, ns_info) = match (
        documents_of(request, "ops"),
        documents_of(request, "nsInfo"),
    ) {
        (Ok(ops), Ok(ns_info)) => (ops, ns_info),
        (Err(e), _) | (_, Err(e)) => return e,
    };
    let errors_only = request.body.get_bool("errorsOnly").unwrap_or(false);
    let ordered = ordered(&request.body);
    let mut counts = [0usize; 6];
    let [errors, inserted, matched, modified, upserted, deleted] = [0, 1, 2, 3, 4, 5];
    let mut results = Vec::new();
    for (index, op) in ops.iter().enumerate() {
        let Some((kind, target)) = op.iter().next() else {
            return error_reply(2, "empty bulkWrite op");
        };
        let allowed: &[&str] = match kind.as_str() {
            "insert" => &["insert", "document"],
            "update" => &["update", "filter", "updateMods", "multi", "upsert"],
            "delete" => &["delete", "filter", "multi"],
            other => return error_reply(2, &format!("unknown bulkWrite op {other}")),
        };
        if let Some(field) = op.keys().find(|k| !allowed.contains(&k.as_str())) {
            return unsupported_reply(&format!("bulkWrite {kind} field {field}"));
        }
        let ns = match integer(target)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| ns_info.get(i))
            .and_then(|info| info.get_str("ns").ok())
        {
            Some(ns) => ns.to_owned(),
            None => return error_reply(2, "bulkWrite op names no nsInfo entry"),
        };
        // Review15 finding 1 (house rule 7): each op locks its own namespace as it runs
        // (`bulk_write.cpp`: handleGroupedInserts, handleUpdateOp, handleDeleteOp write through
        // `write_ops_exec`), so it gets the pending-DDL checks then; an ordered bulk stopped
        // earlier never locks the rest. In a transaction the LockTimeout is the command's error
        // (`write_ops_exec.cpp`, handleError rethrows a TransientTransactionError), which aborts
        // the transaction (its earlier ops undone); outside one the bulk waits and runs again.
        if let Some(refusal) = pending_ddl_refusal(state.store, &ns, false) {
            return refusal;
        }
        let filter = op.get_document("filter").cloned().unwrap_or_default();
        let multi = op.get_bool("multi").unwrap_or(false);
        // Review34 Y4: the op's error (`userAllowedWriteNS` inside each op's error handling,
        // `bulk_write.cpp`): a `$` in the database's name; then for an insert (after its
        // document's checks) and an upsert, a database the server may not create.
        let creates = kind == "update" && op.get_bool("upsert").unwrap_or(false);
        let refused = crate::database_name::write_refusal(&ns).or_else(|| {
            creates
                .then(|| state.store.creation_refusal(&ns, state.origin.router))
                .flatten()
        });
        if let Some((code, message)) = refused {
            counts[errors] += 1;
            results.push(op_error(index, code, message));
            if ordered {
                break;
            }
            continue;
        }
        let mut result = doc! { "ok": 1.0, "idx": count_i32(index) };
        let mut failed = false;
        match kind.as_str() {
            "insert" => {
                let Ok(document) = op.get_document("document") else {
                    return error_reply(2, "a bulkWrite insert needs a document");
                };
                // Review32 R4, review7 finding 3: the op's error (BadValue 2 over
                // `maxBsonObjectSize`, Overflow 15 nested too deep; `store::insert_refusal`).
                let sent = state.as_sent.get(index).copied().flatten();
                let refusal = crate::store::insert_refusal(document, sent)
                    .or_else(|| state.store.creation_refusal(&ns, state.origin.router));
                if let Some((code, message)) = refusal {
                    counts[errors] += 1;
                    results.push(op_error(index, code, message));
                    if ordered {
                        break;
                    }
                    continue;
                }
                let outcome = match state.store.insert(&ns, vec![document.clone()], true) {
                    Ok(outcome) => outcome,
                    Err(e) => return query_error(e),
                };
                if let Some((_, id)) = outcome.duplicates.first() {
                    failed = true;
                    result = doc! {
                        "ok": 0.0, "idx": count_i32(index), "code": 11000,
                        "codeName": crate::fail_point::code_name_of(11000),
                        "errmsg": crate::store::duplicate_key_message(&ns, id),
                    };
                } else {
                    counts[inserted] += outcome.n;
                    result.insert("n", count_i32(outcome.n));
                }
            }
            "update" => {
                let Ok(update) = op.get_document("updateMods") else {
                    if matches!(op.get("updateMods"), Some(Bson::Array(_))) {
                        return unsupported_reply("pipeline updates");
                    }
                    return error_reply(2, "a bulkWrite update needs updateMods");
                };
                let upsert = op.get_bool("upsert").unwrap_or(false);
                match state.store.update(&ns, &filter, update, multi, upsert) {
                    Ok(outcome) => {
                        counts[matched] += outcome.matched;
                        counts[modified] += outcome.modified;
                        let n = outcome.matched + usize::from(outcome.upserted.is_some());
                        result.insert("n", count_i32(n));
                        result.insert("nModified", count_i32(outcome.modified));
                        if let Some(id) = outcome.upserted {
                            counts[upserted] += 1;
                            result.insert("upserted", doc! { "_id": id });
                        }
                    }
                    // An upsert of an `_id` already there (11000) or a change of an `_id` (66)
                    // fails this operation, as an insert's duplicate does.
                    Err(QueryError::Write(code, message)) => {
                        failed = true;
                        result = doc! {
                            "ok": 0.0, "idx": count_i32(index), "code": code,
                            "codeName": crate::fail_point::code_name_of(code), "errmsg": message,
                        };
                    }
                    Err(e) => return query_error(e),
                }
            }
            _ => match state.store.delete(&ns, &filter, multi) {
                Ok(removed) => {
                    counts[deleted] += removed.len();
                    result.insert("n", count_i32(removed.len()));
                }
                Err(e) => return query_error(e),
            },
        }
        if failed {
            counts[errors] += 1;
        }
        if failed || !errors_only {
            results.push(result);
        }
        if failed && ordered {
            break;
        }
    }
    let batch = state
        .store
        .open_cursor(state.origin, "admin.$cmd.bulkWrite", results, usize::MAX);
    let mut reply = cursor_reply("firstBatch", "admin.$cmd.bulkWrite", batch);
    for (field, slot) in [
        ("nErrors", errors),
        ("nInserted", inserted),
        ("nMatched", matched),
        ("nModified", modified),
        ("nUpserted", upserted),
        ("nDeleted", deleted),
    ] {
        reply.insert(field, count_i32(counts[slot]));
    }
    reply
}

/// A `bulkWrite` op's error result: code, its name and message.
fn op_error(index: usize, code: i32, message: String) -> Document {
    doc! {
        "ok": 0.0, "idx": count_i32(index), "code": code,
        "codeName": crate::fail_point::code_name_of(code), "errmsg": message,
    }
}

/// `{findAndModify: coll, query, sort, update | remove, new, upsert}` (no fields).
fn find_and_modify(state: &mut Context<'_>, db: &str, command: &Document) -> Document {
    let collection = match collection_name(command, "findAndModify") {
        Ok(c) => c,
        Err(e) => return e,
    };
    for unsupported in ["fields", "arrayFilters"] {
        if command.contains_key(unsupported) {
            return unsupported_reply(&format!("findAndModify {unsupported}"));
        }
    }
    let ns = format!("{db}.{collection}");
    if let Some((code, message)) = crate::database_name::write_refusal(&ns) {
        return error_reply(code, &message);
    }
    // Review34 Y4: an upsert creating the collection, and with it a database the server may
    // not create, fails the command.
    let upserting =
        !command.get_bool("remove").unwrap_or(false) && command.get_bool("upsert").unwrap_or(false);
    if let Some(refusal) = upserting.then(|| creation_ns_refusal(state, &ns)).flatten() {
        return refusal;
    }
    let mut filter = command.get_document("query").cloned().unwrap_or_default();
    let mut matching = match state.store.matching(&ns, &filter) {
        Ok(docs) => docs,
        Err(e) => return query_error(e),
    };
    // TK-14: with `sort`, the first document in that order is the one modified.
    if let Some(sort) = command.get("sort") {
        let Bson::Document(sort) = sort else {
            return error_reply(2, "sort must be a document");
        };
        if let Err(e) = sort_documents(&mut matching, sort) {
            return e;
        }
        if let Some(id) = matching.first().and_then(|d| d.get("_id")) {
            filter = doc! { "_id": id.clone() };
        }
    }
    let before = matching.into_iter().next();
    if command.get_bool("remove").unwrap_or(false) {
        if let Err(e) = state.store.delete(&ns, &filter, false) {
            return query_error(e);
        }
        let n = i32::from(before.is_some());
        let value = before.map_or(Bson::Null, Bson::Document);
        return doc! { "lastErrorObject": { "n": n }, "value": value, "ok": 1.0 };
    }
    let Ok(update) = command.get_document("update") else {
        return error_reply(2, "findAndModify needs update or remove");
    };
    let upsert = command.get_bool("upsert").unwrap_or(false);
    let outcome = match state.store.update(&ns, &filter, update, false, upsert) {
        Ok(o) => o,
        Err(e) => return query_error(e),
    };
    let after_filter = match (
        &outcome.upserted,
        before.as_ref().and_then(|d| d.get("_id")),
    ) {
        (Some(id), _) | (None, Some(id)) => doc! { "_id": id.clone() },
        (None, None) => {
            return doc! { "lastErrorObject": { "n": 0, "updatedExisting": false }, "value": Bson::Null, "ok": 1.0 }
        }
    };
    let value = if command.get_bool("new").unwrap_or(false) {
        state
            .store
            .matching(&ns, &after_filter)
            .ok()
            .and_then(|d| d.into_iter().next())
    } else {
        before
    };
    let mut last_error = doc! { "n": 1, "updatedExisting": outcome.upserted.is_none() };
    if let Some(id) = outcome.upserted {
        last_error.insert("upserted", id);
    }
    doc! { "lastErrorObject": last_error, "value": value.map_or(Bson::Null, Bson::Document), "ok": 1.0 }
}

/// Review13 finding 3 (TK-2, house rule 7): the `query` of a `count` or `distinct` (`name`), by
/// the commands' IDL (`query: type: object`): a document, or none for all documents; anything
/// else TypeMismatch (14), "BSON field '\<name\>.query' is the wrong type ...". A `null` or
/// `undefined` is taken as none, the default, as the server's IDL parser takes any field of the
/// wrong type that is one of them (`IDLParserContext::checkAndAssertTypeSlowPath`, leftovers12
/// item 3).
fn query_filter(command: &Document, name: &str) -> Result<Document, Document> {
    match command.get("query") {
        None | Some(Bson::Null | Bson::Undefined) => Ok(Document::new()),
        Some(Bson::Document(query)) => Ok(query.clone()),
        Some(other) => Err(crate::refusals::wrong_type(
            &format!("{name}.query"),
            other,
            "object",
        )),
    }
}

/// `{count: coll, query, skip, limit}`.
fn count(state: &mut Context<'_>, db: &str, command: &Document) -> Document {
    let collection = match collection_name(command, "count") {
        Ok(c) => c,
        Err(e) => return e,
    };
    let filter = match query_filter(command, "count") {
        Ok(f) => f,
        Err(e) => return e,
    };
    match state.store.matching(&format!("{db}.{collection}"), &filter) {
        Ok(docs) => {
            let skip = command.get("skip").and_then(integer).unwrap_or(0).max(0) as usize;
            let mut n = docs.len().saturating_sub(skip);
            if let Some(limit) = command.get("limit").and_then(integer).filter(|&l| l > 0) {
                n = n.min(limit as usize);
            }
            doc! { "n": count_i32(n), "ok": 1.0 }
        }
        Err(e) => query_error(e),
    }
}

/// `{distinct: coll, key, query}`: top-level keys.
fn distinct(state: &mut Context<'_>, db: &str, command: &Document) -> Document {
    let collection = match collection_name(command, "distinct") {
        Ok(c) => c,
        Err(e) => return e,
    };
    let Ok(key) = command.get_str("key") else {
        return error_reply(2, "distinct needs a key");
    };
    let filter = match query_filter(command, "distinct") {
        Ok(f) => f,
        Err(e) => return e,
    };
    if key.contains('.') {
        return unsupported_reply(&format!("distinct on the path {key}"));
    }
    let docs = match state.store.matching(&format!("{db}.{collection}"), &filter) {
        Ok(docs) => docs,
        Err(e) => return query_error(e),
    };
    match distinct_values(docs.iter().filter_map(|d| d.get(key))) {
        Ok(values) => doc! { "values": values, "ok": 1.0 },
        Err(what) => unsupported_reply(&what),
    }
}

/// A real server's `distinct` values of a field: an array's elements each count on their own
/// (one level), and the values are kept in a set ordered by the server's BSON comparison
/// (`BSONElementSet`), so two values are the same when they compare equal (`1`, `1.0` and
/// `NumberLong(1)` are one value, the first seen) and the reply lists them in that order
/// ([`crate::query::order`]). TK-2: an empty array (not modelled), or several values one of which
/// the test server cannot order exactly ([`crate::query::sort_rank`]), is refused.
fn distinct_values<'a>(found: impl Iterator<Item = &'a Bson>) -> Result<Vec<Bson>, String> {
    let mut values = Vec::new();
    for value in found {
        match value {
            Bson::Array(items) if items.is_empty() => {
                return Err(String::from("distinct over an empty array"))
            }
            Bson::Array(items) => values.extend(items.iter().cloned()),
            other => values.push(other.clone()),
        }
    }
    if values.len() > 1 {
        for value in &values {
            crate::query::sort_rank(Some(value)).map_err(|e| format!("distinct: {}", e.0))?;
        }
    }
    // A stable sort keeps the first seen of equal values first.
    values.sort_by(|a, b| crate::query::order(Some(a), Some(b)));
    values.dedup_by(|later, first| crate::query::order(Some(first), Some(later)).is_eq());
    Ok(values)
}

/// The stages [`aggregate`] runs that read the collection the command names: refused first in
/// `{aggregate: 1}` (InvalidNamespace 73).
const COLLECTION_STAGES: [&str; 10] = [
    "$match",
    "$skip",
    "$limit",
    "$sort",
    "$count",
    "$project",
    "$addFields",
    "$group",
    "$out",
    "$merge",
];

/// `{aggregate: coll | 1, pipeline, cursor}` with the stages `$match`, `$skip`, `$limit`,
/// `$count`, `$project` (inclusion / exclusion of top-level fields), `$addFields`, and a leading
/// `$changeStream` (an open cursor with an empty first batch). `$out` / `$merge` and any other
/// stage are refused by name.
fn aggregate(
    state: &mut Context<'_>,
    db: &str,
    command: &Document,
    max_wire_version: i32,
) -> Document {
    let collection = match command.get("aggregate") {
        Some(Bson::String(c)) => c.clone(),
        Some(v) if integer(v) == Some(1) => String::from("$cmd.aggregate"),
        _ => return error_reply(2, "aggregate needs a collection name or 1"),
    };
    // Review21 R6: a `pipeline` that is not an array, or an element of it that is not a
    // document, is TypeMismatch 14 (`aggregation_request.cpp`; the 5.0+ IDL parser's
    // `parsePipelineFromBSON` says the same). Review22 R3: a missing one is 14 too before 5.0
    // (`AggregationRequest::parseFromBSON` tests `eoo()` with the type), and from 5.0 the IDL
    // parser's required-field check, 40414. Both come before the `cursor` check (9): the
    // server parses `pipeline` first.
    let pipeline = match command.get("pipeline") {
        Some(Bson::Array(pipeline)) => pipeline,
        None if max_wire_version >= IDL_AGGREGATE_WIRE_VERSION => {
            return error_reply(
                40414,
                "BSON field 'aggregate.pipeline' is missing but a required field",
            )
        }
        _ => return error_reply(14, "'pipeline' option must be specified as an array"),
    };
    let documents: Option<Vec<&Document>> = pipeline
        .iter()
        .map(|stage| match stage {
            Bson::Document(stage) => Some(stage),
            _ => None,
        })
        .collect();
    let Some(documents) = documents else {
        return error_reply(14, "Each element of the 'pipeline' array must be an object");
    };
    let Ok(cursor) = command.get_document("cursor") else {
        return error_reply(9, "The 'cursor' option is required");
    };
    let batch_size = match cursor.get("batchSize") {
        None => state.batch_size as usize,
        Some(v) => match integer(v).and_then(|v| usize::try_from(v).ok()) {
            Some(b) => b,
            None => return error_reply(2, "batchSize must be a non-negative integer"),
        },
    };
    let ns = format!("{db}.{collection}");
    let mut stages = Vec::new();
    for stage in documents {
        // Review21 R6 (house rule 7): `LiteParsedDocumentSource::parse` (3.6+) refuses a stage
        // document with other than exactly one field (40323) when the command is parsed,
        // before anything else; `DocumentSource::parse`'s 16435 for the same is never reached.
        let (1, Some((name, spec))) = (stage.len(), stage.iter().next()) else {
            return error_reply(
                40323,
                "A pipeline stage specification object must contain exactly one field.",
            );
        };
        stages.push((name.as_str(), spec));
    }
    // Versioned-api, house rule 7: under `apiStrict: true` a stage outside API version 1 is
    // APIStrictError (323) when the pipeline is parsed, before anything runs
    // (`AllowedWithApiStrict::kNeverInVersion1`). Of the stages here only `$listLocalSessions`
    // is; the others are in it (`$changeStream` conditionally, on options the test server does
    // not read).
    let strict = command.get("apiStrict") == Some(&Bson::Boolean(true));
    if strict && stages.iter().any(|(name, _)| *name == "$listLocalSessions") {
        return error_reply(
            323,
            "$listLocalSessions is not allowed with 'apiStrict: true' in API Version 1",
        );
    }
    // Review21 R6 (house rule 7, 11): each stage's arguments are checked as the pipeline is
    // parsed (`createFromBson`), before it is validated (73 below), run, or read by
    // `optimized_away`.
    for &(name, spec) in &stages {
        let parsed = match name {
            "$skip" | "$limit" => count_argument(name, spec, max_wire_version).map(drop),
            "$project" | "$addFields" => projection_argument(name, spec, max_wire_version),
            _ => Ok(()),
        };
        if let Err(refusal) = parsed {
            return refusal;
        }
    }
    // Review15 finding 1 (house rule 7): `{aggregate: 1}` reads and locks no collection
    // (`run_aggregate.cpp`: a collectionless pipeline with no foreign namespace takes no lock),
    // so its first stage must need none (`pipeline.cpp`, `Pipeline::validateCommon`:
    // InvalidNamespace 73). Of the stages here only `$changeStream` and `$listLocalSessions`
    // need none; the stages reading other namespaces (`$lookup`, `$unionWith`, `$graphLookup`)
    // are refused by name below, as any stage the test server does not run.
    if collection == "$cmd.aggregate" {
        if let Some((first, _)) = stages.first() {
            if COLLECTION_STAGES.contains(first) {
                return error_reply(
                    73,
                    &format!(
                        "{{aggregate: 1}} is not valid for '{first}'; a collection is required."
                    ),
                );
            }
        }
    }
    if let Some(("$changeStream", _)) = stages.first() {
        if stages.len() > 1 {
            return unsupported_reply("$changeStream followed by other stages");
        }
        let mut batch = state.store.open_cursor(state.origin, &ns, Vec::new(), 0);
        batch.cursor_id = state.store.open_change_stream(state.origin, &ns);
        let mut reply = cursor_reply("firstBatch", &ns, batch);
        if let Ok(cursor) = reply.get_document_mut("cursor") {
            cursor.insert("postBatchResumeToken", doc! { "_data": "00" });
        }
        return reply;
    }
    let locks_collection =
        collection != "$cmd.aggregate" && optimized_away(&stages, max_wire_version);
    let mut documents = state.store.documents(&ns);
    let mut first = true;
    let stage_count = stages.len();
    for (index, (name, spec)) in stages.into_iter().enumerate() {
        let last = index + 1 == stage_count;
        documents = match (name, spec) {
            ("$match", Bson::Document(filter)) => {
                let mut kept = Vec::new();
                for d in documents {
                    match crate::query::matches(&d, filter) {
                        Ok(true) => kept.push(d),
                        Ok(false) => {}
                        Err(e) => return query_error(QueryError::UnsupportedFilter(e.0)),
                    }
                }
                kept
            }
            ("$skip" | "$limit", n) => {
                let count = match count_argument(name, n, max_wire_version) {
                    Ok(count) => usize::try_from(count).unwrap_or(usize::MAX),
                    Err(refusal) => return refusal,
                };
                if name == "$skip" {
                    documents.into_iter().skip(count).collect()
                } else {
                    documents.into_iter().take(count).collect()
                }
            }
            ("$sort", Bson::Document(sort)) => {
                let mut documents = documents;
                if let Err(e) = sort_documents(&mut documents, sort) {
                    return e;
                }
                documents
            }
            ("$count", Bson::String(field)) => vec![doc! { field: count_i32(documents.len()) }],
            ("$project" | "$addFields", Bson::Document(spec)) => {
                match project(documents, spec, name == "$addFields") {
                    Ok(d) => d,
                    Err(e) => return e,
                }
            }
            ("$group", Bson::Document(spec)) => match group(documents, spec) {
                Ok(d) => d,
                Err(e) => return e,
            },
            ("$listLocalSessions", Bson::Document(spec)) if spec.is_empty() && first => {
                if collection != "$cmd.aggregate" {
                    return error_reply(
                        73,
                        "$listLocalSessions must be run against the database with {aggregate: \
                         1}, not a collection",
                    );
                }
                state.store.local_sessions()
            }
            // TK-15: a real server refuses them in a transaction
            // (OperationNotSupportedInTransaction, 263, `DocumentSourceOut::createFromBson`).
            ("$out" | "$merge", _) if state.origin.txn_number.is_some() => {
                return error_reply(263, &format!("{name} cannot be used in a transaction"));
            }
            ("$out" | "$merge", target) if last => {
                let into = match (name, target) {
                    ("$out", Bson::String(c)) => c.clone(),
                    ("$merge", Bson::String(c)) => c.clone(),
                    ("$merge", Bson::Document(m)) if m.len() == 1 => match m.get("into") {
                        Some(Bson::String(c)) => c.clone(),
                        _ => return unsupported_reply("$merge other than {into: <collection>}"),
                    },
                    _ => return unsupported_reply(&format!("{name} other than a collection name")),
                };
                let target = format!("{db}.{into}");
                // TK-15: outside a transaction, both wait for one holding their target.
                let written = if name == "$out" {
                    state.store.replace_collection(&target, documents)
                } else {
                    state.store.merge(&target, documents)
                };
                if let Err(e) = written {
                    return query_error(e);
                }
                Vec::new()
            }
            (other, _) => return unsupported_reply(&format!("pipeline stage {other}")),
        };
        first = false;
    }
    let batch = state
        .store
        .open_cursor(state.origin, &ns, documents, batch_size);
    if locks_collection {
        state.store.note_locking_cursor(batch.cursor_id);
    }
    cursor_reply("firstBatch", &ns, batch)
}

/// Docs13 (TK-15, house rule 7): whether a server of `max_wire_version` before 5.0 answers an
/// aggregate with `stages` by its query layer alone, so that the cursor's getMore takes the
/// collection's IS lock as a `find` cursor's does (and queues behind a pending DDL command)
/// rather than locking only when its `$cursor` stage reads more. From 4.2 (wire 8) a pipeline
/// left empty once its leading `$match` stages are pulled into the query is optimized away
/// (`run_aggregate.cpp`, `canOptimizeAwayPipeline`; the executor gets the `kLockExternally`
/// policy; `pipeline_d.cpp` pops the leading `$match`, `document_source_match.cpp` drops an
/// empty one), and so is a `$sort` an index provides without a blocking sort stage (the
/// `_id` index here: `{_id: 1}` or `{_id: -1}`; `prepareExecutor` pops the `$sort` the query
/// system can sort without blocking); from 4.4 (wire 9) the query layer takes any `$sort`
/// (with the `$limit` it coalesced) and a leading `$limit` (`pipeline_d.cpp`,
/// `prepareExecutor`, `extractLimitForPushdown`), then a leading inclusion `$project`
/// (`buildProjectionForPushdown`, review21 R2). 4.0 and older always run a pipeline. The
/// stages are read as the server's optimization phase leaves them ([`reordered_stages`]).
fn optimized_away(stages: &[(&str, &Bson)], max_wire_version: i32) -> bool {
    let stages = reordered_stages(stages, max_wire_version);
    let mut rest = stages.iter().skip_while(|(name, _)| *name == "$match");
    let by_id = |spec: &Bson| {
        matches!(spec, Bson::Document(keys) if keys.len() == 1
            && keys.get("_id").and_then(integer).is_some_and(|d| d == 1 || d == -1))
    };
    match max_wire_version {
        8 => match (rest.next(), rest.next()) {
            (None, _) => true,
            (Some(("$sort", spec)), None) => by_id(spec),
            _ => false,
        },
        // Review21 R2: 4.4 (`buildInnerQueryExecutorGeneric`, `prepareExecutor`) takes a
        // leading `$sort` with the `$limit`s it absorbed over stages that swap with a limit
        // (`$project`, `$addFields`), or else the `$limit`s `extractLimitForPushdown` takes
        // from the front over them, then one leading inclusion `$project`
        // (`buildProjectionForPushdown`).
        9..LOCK_FREE_READS_WIRE_VERSION => {
            let mut rest: Vec<(&str, &Bson)> = rest.copied().collect();
            let sort = usize::from(matches!(rest.first(), Some(("$sort", _))));
            let mut at = sort;
            while let Some(&(name, _)) = rest.get(at) {
                match name {
                    "$limit" => {
                        rest.remove(at);
                    }
                    "$project" | "$addFields" => at += 1,
                    _ => break,
                }
            }
            match &rest[sort..] {
                [] => true,
                [("$project", Bson::Document(spec))] => inclusion(spec),
                _ => false,
            }
        }
        _ => false,
    }
}

/// Review19 R5 (TK-15, house rule 7): `stages` as the server's pipeline optimization leaves
/// them before it decides what the query layer takes (4.2 and 4.4: `Pipeline::optimizeContainer`
/// runs each stage's `optimizeAt`, then each stage's `optimize`): a `$match` that follows a
/// `$sort` moves in front of it (`DocumentSource::pushMatchBefore`: a `$sort` swaps with a
/// `$match` unless it absorbed a `$limit`, and modifies no path), so over a run of `$sort`s;
/// a `$limit` right after a `$limit` merges into it (`DocumentSourceLimit::doOptimizeAt`:
/// the smaller of the two); an empty `$match` and a `$skip` of 0 go
/// (`DocumentSourceMatch::optimize`, `DocumentSourceSkip::optimize`). The server drops those
/// two after the reordering, here before it: a pipeline with one between a `$sort` and a
/// `$match` counts as optimized away where the server keeps it (stricter, never more
/// forgiving). Adjacent `$match`es stay two entries here: both lead, or neither does, as one
/// merged would. Review21 R1: a `$sort` right after a `$sort` (or after the `$limit` it
/// absorbed) replaces it, keeping that `$limit` (4.4's `DocumentSourceSort::doOptimizeAt`
/// erases the first and keeps the lower limit); 4.2's does not merge them, so there this is
/// stricter. Review21 R2: a `$match` also moves over an inclusion `$project` that keeps every
/// field it reads ([`keeps_fields_read`]). Not modelled (docs/testkit.md "Limits"): a `$match`
/// moved over an exclusion `$project` or an `$addFields`, and a `$limit` moved over a `$skip`,
/// which leave a stage in the pipeline either way; the `$limit`s a `$sort` absorbs over other
/// stages are read by [`optimized_away`].
fn reordered_stages<'a>(
    stages: &[(&'a str, &'a Bson)],
    max_wire_version: i32,
) -> Vec<(&'a str, &'a Bson)> {
    let mut reordered: Vec<(&str, &Bson)> = Vec::with_capacity(stages.len());
    for &(name, spec) in stages {
        match (name, spec) {
            ("$match", Bson::Document(filter)) if filter.is_empty() => {}
            ("$skip", skip) if count_argument(name, skip, max_wire_version) == Ok(0) => {}
            ("$limit", _) if reordered.last().is_some_and(|(last, _)| *last == "$limit") => {}
            ("$sort", _) => {
                let merged = match reordered.as_slice() {
                    [.., ("$sort", _)] => Some(reordered.len() - 1),
                    [.., ("$sort", _), ("$limit", _)] => Some(reordered.len() - 2),
                    _ => None,
                };
                match merged {
                    Some(at) => reordered[at] = (name, spec),
                    None => reordered.push((name, spec)),
                }
            }
            ("$match", Bson::Document(filter)) => {
                let passed = reordered
                    .iter()
                    .rev()
                    .take_while(|(stage, spec)| match (*stage, spec) {
                        ("$sort", _) => true,
                        ("$project", Bson::Document(projection)) => {
                            inclusion(projection) && keeps_fields_read(projection, filter)
                        }
                        _ => false,
                    })
                    .count();
                reordered.insert(reordered.len() - passed, (name, spec));
            }
            _ => reordered.push((name, spec)),
        }
    }
    reordered
}

/// Whether a `$project` includes fields (`TransformerType::kInclusionProjection`): a field
/// other than `_id` set to true or a non-zero number, or `_id` alone so set.
fn inclusion(spec: &Document) -> bool {
    spec.iter().any(|(k, v)| k != "_id" && truthy(v))
        || (spec.len() == 1 && spec.get("_id").is_some_and(truthy))
}

/// A projection value that includes its field.
fn truthy(value: &Bson) -> bool {
    integer(value).is_some_and(|v| v != 0) || matches!(value, Bson::Boolean(true))
}

/// Review21 R2 (house rule 7): whether the inclusion `projection` keeps every top-level field
/// `filter` reads (`_id` unless excluded), so that the `$match` moves in front of it
/// (`DocumentSource::pushMatchBefore`: an inclusion projection modifies all paths but the
/// ones it keeps; a `$match` that reads one it drops stays, in part or whole, after it). The
/// clauses of `$and` / `$or` / `$nor` are read; `$comment` reads nothing; another top-level
/// operator (`$expr`, ...) counts as reading kept fields only, so such a `$match` moves here
/// where the server may keep it (stricter).
fn keeps_fields_read(projection: &Document, filter: &Document) -> bool {
    filter
        .iter()
        .all(|(key, value)| match (key.as_str(), value) {
            ("$and" | "$or" | "$nor", Bson::Array(clauses)) => clauses
                .iter()
                .all(|c| matches!(c, Bson::Document(c) if keeps_fields_read(projection, c))),
            (operator, _) if operator.starts_with('$') => true,
            (path, _) => {
                let field = path.split('.').next().unwrap_or(path);
                match projection.get(field) {
                    Some(kept) => truthy(kept),
                    None => field == "_id",
                }
            }
        })
}

/// From 5.0 (wire 13) `$skip` and `$limit` take only an integer
/// (`BSONElement::parseIntegerElementToNonNegativeLong`, codes 5107200 and 5107201).
const INTEGER_STAGE_COUNT_WIRE_VERSION: i32 = 13;

/// Review21 R6 (house rule 7, 11): the count a `$skip` or `$limit` stage takes, refused as the
/// server refuses it when it parses the stage (`DocumentSourceSkip::createFromBson`,
/// `DocumentSourceLimit::createFromBson` and `create`). Before 5.0: a value that is no number
/// is 15972 (`$skip`) / 15957 (`$limit`), a number is read as `BSONElement::numberLong` reads
/// it (a double cut toward zero by a C cast, which on x86-64 makes a NaN or a double out of
/// range the most negative long), then a negative `$skip` is 15956 and a `$limit` below 1 is
/// 15958. From 5.0: no number, a NaN, a double out of range or not integral, and a negative
/// value are 5107200 / 5107201 ("invalid argument to $skip stage: ..."), and a `$limit` of 0
/// is 15958. A Decimal128 (a number to the server) is TestkitUnsupported.
fn count_argument(stage: &str, value: &Bson, max_wire_version: i32) -> Result<u64, Document> {
    const TWO_TO_63: f64 = 9_223_372_036_854_775_808.0;
    let limit = stage == "$limit";
    let out_of_range = |v: f64| !(-TWO_TO_63..TWO_TO_63).contains(&v);
    if let Bson::Decimal128(_) = value {
        return Err(unsupported_reply(&format!("{stage} given as a Decimal128")));
    }
    let number = if max_wire_version < INTEGER_STAGE_COUNT_WIRE_VERSION {
        match value {
            Bson::Int32(v) => i64::from(*v),
            Bson::Int64(v) => *v,
            Bson::Double(v) if v.is_nan() || out_of_range(*v) => i64::MIN,
            Bson::Double(v) => *v as i64,
            _ if limit => {
                return Err(error_reply(
                    15957,
                    "the limit must be specified as a number",
                ))
            }
            other => {
                return Err(error_reply(
                    15972,
                    &format!(
                        "Argument to $skip must be a number not a {}",
                        crate::refusals::type_name(other)
                    ),
                ))
            }
        }
    } else {
        let code = if limit { 5107201 } else { 5107200 };
        let refuse = |reason: &str| {
            let shown = shown(value);
            error_reply(
                code,
                &format!("invalid argument to {stage} stage: {reason}: {stage}: {shown}"),
            )
        };
        let number = match value {
            Bson::Int32(v) => i64::from(*v),
            Bson::Int64(v) => *v,
            Bson::Double(v) if v.is_nan() => {
                return Err(refuse("Expected an integer, but found NaN in"))
            }
            Bson::Double(v) if out_of_range(*v) => {
                return Err(refuse("Cannot represent as a 64-bit integer"))
            }
            Bson::Double(v) if v.fract() != 0.0 => return Err(refuse("Expected an integer")),
            Bson::Double(v) => *v as i64,
            _ => return Err(refuse("Expected a number in")),
        };
        if number < 0 {
            return Err(refuse("Expected a non-negative number in"));
        }
        number
    };
    match u64::try_from(number) {
        Ok(0) if limit => Err(error_reply(15958, "the limit must be positive")),
        Ok(count) => Ok(count),
        Err(_) if limit => Err(error_reply(15958, "the limit must be positive")),
        Err(_) => Err(error_reply(15956, "Argument to $skip cannot be negative")),
    }
}

/// From 5.0 (wire 13) the `aggregate` command is parsed by its IDL parser: a missing
/// `pipeline` is its required-field refusal (40414), not TypeMismatch 14.
const IDL_AGGREGATE_WIRE_VERSION: i32 = 13;

/// From 4.4 (wire 9) `$project` is parsed by the query layer's projection parser
/// (`projection_ast::parseAndAnalyze`, `projection_parser.cpp`), with its own codes.
const PROJECTION_AST_WIRE_VERSION: i32 = 9;

/// From 5.0 (wire 13) `$addFields: {}` is taken (a no-op); before, it is 40177. Review23 R3
/// (house rule 7), checked in stored copies of the server's source (the `r4.4.0` tag itself
/// could not be reached): `ProjectionSpecValidator::validate` refuses an empty specification in
/// 3.4-, 3.6- and 4.2-era `parsed_aggregation_projection.cpp` and in a 4.3-development one; after
/// the executor moved to `src/mongo/db/exec/` (the layout 4.4 shipped), that copy's
/// `add_fields_projection_executor_test.cpp` still asserts that an empty specification throws;
/// a 4.9-development and later `add_fields_projection_executor.cpp` have no such check.
const EMPTY_ADD_FIELDS_WIRE_VERSION: i32 = 13;

/// From 4.2 (wire 8) the projection validator's refusals name their stage as the context of the
/// error ("Invalid $project :: caused by :: ..."); 3.4 and 3.6 prefix the reason with "Invalid
/// $project specification: " (or `$addFields`). Review23 R4, read in the same stored copies as
/// [`ID_SETS_NO_KIND_WIRE_VERSION`] (`uassertValid` with `addContext` in the 4.2-era one, a
/// `Status` reason in the 3.x ones, and in the 3.x-era `parsed_add_fields.cpp`); no 4.0 copy was
/// reached, 4.0 is taken to be as 3.6. 4.4's wording of its empty `$addFields` refusal was not
/// read either: it is given the 4.2 one.
const STAGE_CONTEXT_WIRE_VERSION: i32 = 8;

/// From 4.2 (wire 8) a truthy `_id` no longer decides whether a `$project` is an inclusion.
/// Review23 R3 (house rule 7), checked in stored copies of `parsed_aggregation_projection.cpp`:
/// a 4.2-era `ProjectTypeParser::parseElement` lets a numeric or boolean `_id` set no kind; the
/// 3.4- and 3.6-era ones count a truthy `_id` as any included field. No 4.0 copy could be
/// reached: 4.0 is taken to be as 3.6.
const ID_SETS_NO_KIND_WIRE_VERSION: i32 = 8;

/// Review22 R1, R2 (house rules 7 and 11): a `$project` or `$addFields` specification refused
/// as the server refuses it when it parses the stage (`createFromBson`), before anything runs.
/// A `$project` that is no document is 15969, an `$addFields` one 40272. An empty `$project` is
/// 40177 before 4.4 (`ProjectionSpecValidator`) and 51272 from 4.4 (`parseAndAnalyze`); an
/// empty `$addFields` is 40177 before 5.0. A `$project` mixing inclusion and exclusion
/// ([`mixed_field`]) is 40178 / 40179 before 4.4 (`ProjectTypeParser`, where before 4.2 a
/// truthy `_id` makes it an inclusion, [`ID_SETS_NO_KIND_WIRE_VERSION`]) and 31254 / 31253
/// from 4.4 (`parseExclusion` / `parseInclusion`). What the test server does not run is
/// TestkitUnsupported (TK-2) here, before [`optimized_away`] reads the stages
/// ([`projection_refusal`]: values other than integral numbers and booleans, and a dotted path,
/// which a real server projects as the embedded field where [`project`] keeps top-level fields
/// only).
fn projection_argument(stage: &str, value: &Bson, max_wire_version: i32) -> Result<(), Document> {
    let spec = match (stage, value) {
        (_, Bson::Document(spec)) => spec,
        ("$project", _) => {
            return Err(error_reply(
                15969,
                "$project specification must be an object",
            ))
        }
        (_, other) => {
            return Err(error_reply(
                40272,
                &format!(
                    "{stage} specification stage must be an object, got {}",
                    crate::refusals::type_name(other)
                ),
            ))
        }
    };
    let ast = max_wire_version >= PROJECTION_AST_WIRE_VERSION;
    if spec.is_empty() {
        return match stage {
            "$project" if ast => Err(error_reply(
                51272,
                "Invalid $project :: caused by :: projection specification must have at least \
                 one field",
            )),
            _ if stage == "$project" || max_wire_version < EMPTY_ADD_FIELDS_WIRE_VERSION => {
                let message = "specification must have at least one field";
                Err(error_reply(
                    40177,
                    &if max_wire_version < STAGE_CONTEXT_WIRE_VERSION {
                        format!("Invalid {stage} specification: {message}")
                    } else {
                        format!("Invalid {stage} :: caused by :: {message}")
                    },
                ))
            }
            _ => Ok(()),
        };
    }
    if stage == "$addFields" {
        return Ok(());
    }
    let id_decides = max_wire_version < ID_SETS_NO_KIND_WIRE_VERSION;
    let refusal = projection_refusal(spec, id_decides, |field, included| {
        let context = "Invalid $project :: caused by ::";
        // Review23 R4: before 4.4 `ProjectTypeParser` raises these outside the validator, so
        // with no stage context, the specification printed as `BSONObj::toString` prints it.
        let (code, message) = match (ast, included) {
            (true, true) => (
                31253,
                format!("{context} Cannot do inclusion on field {field} in exclusion projection"),
            ),
            (true, false) => (
                31254,
                format!("{context} Cannot do exclusion on field {field} in inclusion projection"),
            ),
            (false, true) => (
                40179,
                format!(
                    "Bad projection specification, cannot include fields or add computed fields \
                     during an exclusion projection: {}",
                    shown_document(spec)
                ),
            ),
            (false, false) => (
                40178,
                format!(
                    "Bad projection specification, cannot exclude fields other than '_id' in an \
                     inclusion projection: {}",
                    shown_document(spec)
                ),
            ),
        };
        error_reply(code, &message)
    });
    refusal.map_or(Ok(()), Err)
}

/// Review23 R8 (TK-2, house rule 11): the one check of a projection that `find` and `$project`
/// share, before [`project`] runs it. [`project`] runs integral numbers and booleans on
/// top-level fields, of one kind; `None` when `spec` is such. A projection mixing inclusion and
/// exclusion ([`mixed_field`], with `id_decides`) gets the refusal `mixed` makes of the field
/// that changes the kind and whether it includes; any other projection the test server does not
/// run is TestkitUnsupported.
fn projection_refusal(
    spec: &Document,
    id_decides: bool,
    mixed: impl FnOnce(&str, bool) -> Document,
) -> Option<Document> {
    if !spec.values().all(inclusion_or_exclusion_value) {
        return Some(unsupported_reply(
            "a projection with values other than integral numbers and booleans",
        ));
    }
    if let Some((field, included)) = mixed_field(spec, id_decides) {
        return Some(mixed(field, included));
    }
    let path = spec.keys().find(|k| k.contains('.'))?;
    Some(unsupported_reply(&format!(
        "a projection of the dotted path {path}"
    )))
}

/// A projection value [`project`] runs: an integral number (any, not only 0 or 1: a truthy
/// one includes, as the server's `trueValue` says) or a boolean.
fn inclusion_or_exclusion_value(value: &Bson) -> bool {
    integer(value).is_some() || matches!(value, Bson::Boolean(_))
}

/// Review22 (house rule 7): the first field of a 0/1 projection whose kind (inclusion: true)
/// differs from the kind the fields before it set, with it. A top-level `_id` sets no kind
/// (both kinds may keep or drop it) unless `id_decides` and it is truthy.
fn mixed_field(spec: &Document, id_decides: bool) -> Option<(&str, bool)> {
    let mut kind = None;
    for (field, value) in spec {
        let included = truthy(value);
        if field == "_id" && !(id_decides && included) {
            continue;
        }
        match kind {
            Some(set) if set != included => return Some((field.as_str(), included)),
            _ => kind = Some(included),
        }
    }
    None
}

/// A value as `BSONElement::toString` prints it in the server's messages: a double as
/// `appendDoubleNice` does (".0" added when there is no '.'; digits in Rust's notation, not
/// `%.16g`), a string quoted, anything else as the bson crate prints it.
fn shown(value: &Bson) -> String {
    match value {
        Bson::Double(v) => {
            let text = match v {
                v if v.is_nan() => String::from("nan"),
                v if v.is_infinite() => String::from(if *v > 0.0 { "inf" } else { "-inf" }),
                v => v.to_string(),
            };
            if text.contains('.') {
                text
            } else {
                text + ".0"
            }
        }
        Bson::String(s) => format!("\"{s}\""),
        other => other.to_string(),
    }
}

/// A document as `BSONObj::toString` prints it in the server's messages (review23 R4): `{}` when
/// empty, else `{ ` then each field as `name: value` (the name unquoted, the value as
/// [`shown`]) joined by `, `, then ` }`.
fn shown_document(document: &Document) -> String {
    if document.is_empty() {
        return String::from("{}");
    }
    let fields: Vec<String> = document
        .iter()
        .map(|(name, value)| match value {
            Bson::Document(inner) => format!("{name}: {}", shown_document(inner)),
            value => format!("{name}: {}", shown(value)),
        })
        .collect();
    format!("{{ {} }}", fields.join(", "))
}

/// `$project` by inclusion or exclusion of top-level fields (`_id` kept unless excluded), or
/// `$addFields` with literal values. Review22 R2 (house rule 11): a dotted path, or inclusion
/// mixed with exclusion (a `find` projection; `aggregate` refused both before, in
/// [`projection_argument`]), is TestkitUnsupported rather than a silently wrong result; the
/// check is [`projection_refusal`], shared with `$project`.
fn project(
    documents: Vec<Document>,
    spec: &Document,
    add: bool,
) -> Result<Vec<Document>, Document> {
    let literal = |v: &Bson| {
        !matches!(v, Bson::String(s) if s.starts_with('$')) && !matches!(v, Bson::Document(_))
    };
    if add {
        if !spec.values().all(literal) {
            return Err(unsupported_reply("$addFields with non-literal values"));
        }
        return Ok(documents
            .into_iter()
            .map(|mut d| {
                d.extend(spec.clone());
                d
            })
            .collect());
    }
    let include = inclusion(spec);
    let mixed = |_: &str, _| unsupported_reply("a projection mixing inclusion and exclusion");
    if let Some(refusal) = projection_refusal(spec, false, mixed) {
        return Err(refusal);
    }
    let keep_id = !spec
        .get("_id")
        .is_some_and(|v| integer(v) == Some(0) || matches!(v, Bson::Boolean(false)));
    Ok(documents
        .into_iter()
        .map(|d| {
            d.into_iter()
                .filter(|(k, _)| {
                    if k == "_id" {
                        return keep_id;
                    }
                    let listed = spec.contains_key(k);
                    listed == include
                })
                .collect()
        })
        .collect())
}

/// `{find: coll, filter, batchSize, limit, singleBatch}`: top-level equality filters only.
fn find(state: &mut Context<'_>, db: &str, command: &Document) -> Document {
    let Ok(collection) = command.get_str("find") else {
        return error_reply(2, "find needs a collection name");
    };
    // A `writeConcern` was refused before (72, `refusals::write_concern_refusal`).
    let unknown = |k: &str| !(FIND_FIELDS.contains(&k) || ENVELOPE.contains(&k));
    if let Some(field) = command.keys().find(|k| unknown(k)) {
        return unsupported_reply(&format!("find option {field}"));
    }
    let ns = format!("{db}.{collection}");
    let filter = match command.get("filter") {
        None => Document::new(),
        Some(Bson::Document(f)) => f.clone(),
        Some(_) => return error_reply(2, "filter must be a document"),
    };
    let Some(batch_size) = batch_size(command, state.batch_size) else {
        return error_reply(2, "batchSize must be a non-negative integer");
    };
    let limit = command
        .get("limit")
        .and_then(integer)
        .filter(|&l| l > 0)
        .map(|l| usize::try_from(l).unwrap_or(usize::MAX));
    let skip = command.get("skip").and_then(integer).unwrap_or(0).max(0) as usize;
    let single_batch = matches!(command.get("singleBatch"), Some(Bson::Boolean(true)));
    let mut documents = match state.store.matching(&ns, &filter) {
        Ok(d) => d,
        Err(e) => return query_error(e),
    };
    if let Ok(sort) = command.get_document("sort") {
        if let Err(e) = sort_documents(&mut documents, sort) {
            return e;
        }
    }
    let mut documents: Vec<Document> = documents
        .into_iter()
        .skip(skip)
        .take(limit.unwrap_or(usize::MAX))
        .collect();
    if let Ok(projection) = command.get_document("projection") {
        documents = match project(documents, projection, false) {
            Ok(d) => d,
            Err(e) => return e,
        };
    }
    let mut batch = state
        .store
        .open_cursor(state.origin, &ns, documents, batch_size);
    if single_batch && batch.cursor_id != 0 {
        state
            .store
            .kill_cursors(state.origin.owner, &ns, &[batch.cursor_id]);
        batch.cursor_id = 0;
    }
    state.store.note_locking_cursor(batch.cursor_id);
    cursor_reply("firstBatch", &ns, batch)
}

/// `find`'s own options; with [`ENVELOPE`], the fields it understands.
/// Anything else is `TestkitUnsupported` (TK-2), never ignored.
const FIND_FIELDS: &[&str] = &[
    "find",
    "filter",
    "sort",
    "projection",
    "skip",
    "limit",
    "batchSize",
    "singleBatch",
];

/// `sort` / `$sort` on top-level fields, `1` or `-1` each, in a real server's BSON order
/// ([`crate::query::order`]: a missing field as null, numbers of every type together by value,
/// strings by bytes, ...). TK-2: a dotted path, or a value the test server cannot place exactly
/// ([`crate::query::sort_rank`]: a document, an array, a fractional Decimal128, ...) in any
/// document, is refused before anything is sorted.
fn sort_documents(documents: &mut [Document], sort: &Document) -> Result<(), Document> {
    let mut keys = Vec::new();
    for (field, direction) in sort {
        if field.contains('.') {
            return Err(unsupported_reply(&format!("sort on the path {field}")));
        }
        match integer(direction) {
            Some(1) => keys.push((field.clone(), false)),
            Some(-1) => keys.push((field.clone(), true)),
            _ => return Err(unsupported_reply(&format!("sort direction {direction}"))),
        }
    }
    for (field, _) in &keys {
        for document in documents.iter() {
            if let Err(e) = crate::query::sort_rank(document.get(field)) {
                return Err(unsupported_reply(&e.0));
            }
        }
    }
    documents.sort_by(|a, b| {
        for (field, descending) in &keys {
            let order = crate::query::order(a.get(field), b.get(field));
            let order = if *descending { order.reverse() } else { order };
            if order.is_ne() {
                return order;
            }
        }
        core::cmp::Ordering::Equal
    });
    Ok(())
}

/// `{getMore: id, collection, batchSize}`. Review15 finding 1 (house rule 7): in a transaction
/// its cursor was opened in that transaction, which already holds the collection's lock, so it
/// has no pending-DDL check. Outside one a 5.0+ server's getMore reads lock-free
/// (`getmore_cmd.cpp`: `AutoGetCollectionForReadMaybeLockFree`; `db_raii.cpp`:
/// `supportsLockFreeRead`), so it does not queue behind a DDL command pending on its cursor's
/// namespace; before 5.0 (fixes15c) a `find` cursor's getMore takes the collection's IS lock
/// (`kLockExternally`), which queues behind it, and so does an aggregate's that the server
/// answered with its query layer alone (docs13, [`optimized_away`]; [`Store::is_locking_cursor`]).
fn get_more(
    state: &mut Context<'_>,
    db: &str,
    command: &Document,
    max_wire_version: i32,
) -> Document {
    // A real server's IDL takes the id as a long only (review6 finding 4).
    let id = match command.get("getMore") {
        Some(Bson::Int64(id)) => *id,
        Some(other) => return crate::refusals::wrong_type("getMore.getMore", other, "long"),
        None => return error_reply(2, "getMore needs a cursor id"),
    };
    let Ok(collection) = command.get_str("collection") else {
        return error_reply(2, "getMore needs a collection name");
    };
    // Review37 W5: a real server parses a getMore's `batchSize` as a positive number before it
    // looks the cursor up (mongodb/mongo src/mongo/db/query/getmore_request.cpp,
    // `GetMoreRequest::isValid`; the current server's getmore_cmd.cpp refuses 0 as well):
    // BadValue (2), never the find's "0 means the default".
    if let Some(size) = command.get("batchSize").and_then(integer) {
        if size <= 0 {
            return error_reply(
                2,
                &format!("Batch size for getMore must be positive, but received: {size}"),
            );
        }
    }
    let Some(batch_size) = batch_size(command, state.batch_size) else {
        return error_reply(2, "batchSize must be a non-negative integer");
    };
    let ns = format!("{db}.{collection}");
    let locks = max_wire_version < LOCK_FREE_READS_WIRE_VERSION
        && state.origin.txn_number.is_none()
        && state.store.is_locking_cursor(state.origin.owner, &ns, id);
    if let Some(refusal) = locks
        .then(|| pending_ddl_refusal(state.store, &ns, false))
        .flatten()
    {
        return refusal;
    }
    let max_time = command.contains_key("maxTimeMS");
    match state
        .store
        .get_more(state.origin, &ns, id, batch_size, max_time)
    {
        Ok(batch) => cursor_reply("nextBatch", &ns, batch),
        Err(e) => query_error(e),
    }
}

/// `{killCursors: coll, cursors: [ids]}`.
fn kill_cursors(state: &mut Context<'_>, db: &str, command: &Document) -> Document {
    let Ok(collection) = command.get_str("killCursors") else {
        return error_reply(2, "killCursors needs a collection name");
    };
    let Ok(cursors) = command.get_array("cursors") else {
        return error_reply(2, "killCursors needs an array of cursor ids");
    };
    let mut ids = Vec::with_capacity(cursors.len());
    for (index, id) in cursors.iter().enumerate() {
        match id {
            Bson::Int64(id) => ids.push(*id),
            other => {
                return crate::refusals::wrong_type(
                    &format!("killCursors.cursors.{index}"),
                    other,
                    "long",
                )
            }
        }
    }
    let (killed, not_found) =
        state
            .store
            .kill_cursors(state.origin.owner, &format!("{db}.{collection}"), &ids);
    doc! {
        "cursorsKilled": killed,
        "cursorsNotFound": not_found,
        "cursorsAlive": [],
        "cursorsUnknown": [],
        "ok": 1.0,
    }
}

fn cursor_reply(batch_field: &str, ns: &str, batch: Batch) -> Document {
    let mut cursor = Document::new();
    cursor.insert(batch_field, batch.documents);
    cursor.insert("id", batch.cursor_id);
    cursor.insert("ns", ns);
    doc! { "cursor": cursor, "ok": 1.0 }
}

/// TK-2: the reply to something a real server would run but the test server does not: code
/// [`TESTKIT_UNSUPPORTED`] (`TestkitUnsupported`), which no test expects, so it can never pass
/// as an expected error.
pub(crate) fn unsupported_reply(what: &str) -> Document {
    error_reply(
        TESTKIT_UNSUPPORTED,
        &format!("not supported by retry-testkit: {what}"),
    )
}

/// TK-14: `$group` with a constant `_id` and `{$sum: <number>}` accumulators (one group, none
/// for no input, as a real server); anything else is refused (TK-2).
fn group(documents: Vec<Document>, spec: &Document) -> Result<Vec<Document>, Document> {
    let id = spec
        .get("_id")
        .ok_or_else(|| error_reply(15955, "a group specification must include an _id"))?;
    let constant = match id {
        Bson::String(s) => !s.starts_with('$'),
        Bson::Document(_) | Bson::Array(_) => false,
        _ => true,
    };
    if !constant {
        return Err(unsupported_reply("$group with a non-constant _id"));
    }
    if documents.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = doc! { "_id": id.clone() };
    for (field, accumulator) in spec.iter().filter(|(k, _)| k.as_str() != "_id") {
        let sum = match accumulator {
            Bson::Document(a) if a.len() == 1 => match a.get("$sum") {
                Some(Bson::Int32(n)) => i64::from(*n) * documents.len() as i64,
                Some(Bson::Int64(n)) => n * documents.len() as i64,
                _ => {
                    return Err(unsupported_reply(
                        "$group accumulator other than {$sum: <int>}",
                    ))
                }
            },
            _ => {
                return Err(unsupported_reply(
                    "$group accumulator other than {$sum: <int>}",
                ))
            }
        };
        out.insert(
            field.clone(),
            i32::try_from(sum).map_or(Bson::Int64(sum), Bson::Int32),
        );
    }
    Ok(vec![out])
}

/// `{createIndexes: coll, indexes: [{key, name}]}`; index options it does not keep (unique,
/// sparse, TTL, …) are refused (TK-2).
fn create_indexes(state: &mut Context<'_>, db: &str, command: &Document) -> Document {
    let collection = match collection_name(command, "createIndexes") {
        Ok(c) => c,
        Err(e) => return e,
    };
    let indexes = match command.get_array("indexes") {
        Ok(indexes) if !indexes.is_empty() => indexes,
        _ => return error_reply(2, "Must specify at least one index to create"),
    };
    let ns = format!("{db}.{collection}");
    if let Some(refusal) = creation_ns_refusal(state, &ns) {
        return refusal;
    }
    for index in indexes {
        let Some(index) = index.as_document() else {
            return error_reply(2, "each index must be a document");
        };
        if let Some(option) = index
            .keys()
            .find(|k| !["key", "name"].contains(&k.as_str()))
        {
            return unsupported_reply(&format!("index option {option}"));
        }
        let (Ok(key), Ok(name)) = (index.get_document("key"), index.get_str("name")) else {
            return error_reply(2, "an index needs a key document and a name");
        };
        if let Err((code, message)) = state.store.create_index(&ns, key, name) {
            return error_reply(code, &message);
        }
    }
    ok()
}

/// What any command may carry besides its own fields: the session, transaction, cluster time,
/// read preference, timeout, concerns and API version (the server reads or tolerates these).
/// These are a real server's generic arguments of API version 1 (its `generic_args_api_v1`)
/// but `stmtId` and `clientOperationKey`, which it acts on and the test server does not
/// evaluate: where fields are checked those are refused (TK-2). `stmtId` (a write's first
/// statement id, and a transaction statement's) is refused for every command before it runs:
/// a real server accepts it, but no driver sends it (retryable-writes spec: the server numbers
/// a write's statements by position, as the test server does from 0, [`write_key`]), and
/// numbering from another start would change which retries the test server replays. The one
/// list of them (`unknown_field`, `find`, `setParameter`; review12 finding 7).
pub(crate) const ENVELOPE: &[&str] = &[
    "$db",
    "lsid",
    "txnNumber",
    "autocommit",
    "startTransaction",
    "$clusterTime",
    "$readPreference",
    "maxTimeMS",
    "readConcern",
    "writeConcern",
    "comment",
    "apiVersion",
    "apiStrict",
    "apiDeprecationErrors",
];

/// TK-2: a field the server would act on but the test server does not evaluate is refused,
/// never ignored (`find` has its own list, [`FIND_FIELDS`]). Commands not listed are not checked.
fn unknown_field(name: &str, command: &Document) -> Option<Document> {
    let own: &[&str] = match name {
        "insert" => &["insert", "documents", "ordered"],
        "update" => &["update", "updates", "ordered"],
        "delete" => &["delete", "deletes", "ordered"],
        "findAndModify" => &[
            "findAndModify",
            "query",
            "sort",
            "update",
            "remove",
            "new",
            "upsert",
            "fields",
            "arrayFilters",
        ],
        "count" => &["count", "query", "skip", "limit"],
        "distinct" => &["distinct", "key", "query"],
        "aggregate" => &["aggregate", "pipeline", "cursor"],
        "listCollections" => &["listCollections", "filter", "nameOnly", "cursor"],
        "listDatabases" => &["listDatabases", "filter", "nameOnly"],
        "listIndexes" => &["listIndexes", "cursor"],
        "createIndexes" => &["createIndexes", "indexes"],
        "dropIndexes" | "deleteIndexes" => &[name, "index"],
        "create" => &["create"],
        "drop" => &["drop"],
        "getMore" => &["getMore", "collection", "batchSize"],
        "killCursors" => &["killCursors", "cursors"],
        "bulkWrite" => &["bulkWrite", "ops", "nsInfo", "errorsOnly", "ordered"],
        "commitTransaction" | "abortTransaction" => &[name, "recoveryToken"],
        _ => return None,
    };
    let field = command
        .keys()
        .find(|k| !own.contains(&k.as_str()) && !ENVELOPE.contains(&k.as_str()))?;
    Some(unsupported_reply(&format!("{name} field {field}")))
}

/// TK-3: `cursor.batchSize`, or the server's default.
fn cursor_batch_size(command: &Document, default: u32) -> Result<usize, Document> {
    match command
        .get_document("cursor")
        .ok()
        .and_then(|c| c.get("batchSize"))
    {
        None => Ok(default as usize),
        Some(v) => integer(v)
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| error_reply(2, "batchSize must be a non-negative integer")),
    }
}

/// The documents matching an optional `filter`.
fn filtered(documents: Vec<Document>, filter: Option<&Bson>) -> Result<Vec<Document>, Document> {
    let filter = match filter {
        None => return Ok(documents),
        Some(Bson::Document(f)) => f,
        Some(_) => return Err(error_reply(2, "filter must be a document")),
    };
    let mut kept = Vec::new();
    for d in documents {
        match crate::query::matches(&d, filter) {
            Ok(true) => kept.push(d),
            Ok(false) => {}
            Err(e) => return Err(query_error(QueryError::UnsupportedFilter(e.0))),
        }
    }
    Ok(kept)
}

/// `{listCollections: 1, filter, nameOnly, cursor: {batchSize}}` (TK-3, TK-14). Docs13 (TK-15,
/// house rule 7): before 5.0 it takes locks ([`list_collections_locks`]), so outside a
/// transaction (in one it is refused, 263) it queues behind a pending DDL command on them; from
/// 5.0 it reads the catalog lock-free (`list_collections.cpp`).
fn list_collections(
    state: &mut Context<'_>,
    db: &str,
    command: &Document,
    max_wire_version: i32,
) -> Document {
    let batch_size = match cursor_batch_size(command, state.batch_size) {
        Ok(b) => b,
        Err(e) => return e,
    };
    let name_only = command.get_bool("nameOnly").unwrap_or(false);
    let docs = state
        .store
        .collection_names(db)
        .into_iter()
        .map(|n| doc! { "name": n, "type": "collection", "options": {}, "info": { "readOnly": false } })
        .collect();
    let mut docs = match filtered(docs, command.get("filter")) {
        Ok(d) => d,
        Err(e) => return e,
    };
    // The filter is parsed before any lock is taken: a bad one fails at once.
    if max_wire_version < LOCK_FREE_READS_WIRE_VERSION && state.store.ddl_pending() {
        let existing = state.store.collection_names(db);
        let locks = list_collections_locks(db, command, name_only, &existing, max_wire_version);
        for target in &locks {
            if let Err(e) = state.store.ddl_queue(target, false) {
                return query_error(e);
            }
        }
    }
    if name_only {
        for d in &mut docs {
            d.remove("options");
            d.remove("info");
        }
    }
    let ns = format!("{db}.$cmd.listCollections");
    let batch = state.store.open_cursor(state.origin, &ns, docs, batch_size);
    cursor_reply("firstBatch", &ns, batch)
}

/// Docs13 (TK-15, house rule 7): a `listDatabases` without `nameOnly` before 5.0 takes, for each
/// database in turn, that database's IS lock to read its size (`list_databases.cpp`:
/// `Lock::DBLock` in MODE_IS; on 3.6 and 4.0 it queues behind a DDL pending on any of its
/// collections, [`Store::collection_ddl_target`]), and from 4.2 (wire 8) each of its
/// collections' IS lock too
/// (`StorageEngineImpl::sizeOnDiskForDb`, which replaced the catalog entry's `sizeOnDisk` in
/// 4.2: `catalog::forEachCollectionFromDb` in MODE_IS), so it
/// queues behind a `dropDatabase` pending on any database, and from 4.2 behind a DDL command
/// pending on any collection. A filter on `name` alone (a leaf expression on that path) skips the
/// databases it rules out without locking them. `nameOnly` takes no database lock, and 5.0 and
/// later read lock-free (`AutoGetDbForReadMaybeLockFree`). `Some` reply: it waits.
fn list_databases_queue(
    store: &mut Store,
    command: &Document,
    max_wire_version: i32,
) -> Option<Document> {
    let name_only = command.get_bool("nameOnly").unwrap_or(false);
    if name_only || max_wire_version >= LOCK_FREE_READS_WIRE_VERSION || !store.ddl_pending() {
        return None;
    }
    let name_filter = command
        .get_document("filter")
        .ok()
        .filter(|f| is_name_leaf(f));
    let mut locks = Vec::new();
    let collections = store.seen_collection_names();
    for db in store.database_names() {
        if let Some(filter) = name_filter {
            if !crate::query::matches(&doc! { "name": &db }, filter).unwrap_or(true) {
                continue;
            }
        }
        locks.push(DdlTarget::DatabaseLock(db.clone()));
        if max_wire_version >= COLLECTION_DDL_LOCKS_WIRE_VERSION {
            let in_db = collections
                .iter()
                .filter(|ns| ns.split_once('.').is_some_and(|(d, _)| d == db));
            locks.extend(in_db.map(|ns| DdlTarget::Collection(ns.clone())));
        }
    }
    for target in &locks {
        if let Err(e) = store.ddl_queue(target, false) {
            return Some(query_error(e));
        }
    }
    None
}

/// The wire version of MongoDB 4.2, the first release whose collection DDL (`drop`, `create`,
/// the index commands, `renameCollection` and so `$out`) locks the collection exclusively and
/// the database with an intent lock; 3.6 and 4.0 lock the database exclusively (3.6's
/// `drop_collection.cpp`, `create_collection.cpp`, `create_indexes.cpp`,
/// `rename_collection.cpp`: MODE_X on the database; for 4.0 the 4.2 manual's `drop` page:
/// "Prior to MongoDB 4.2", the parent database's exclusive lock).
const COLLECTION_DDL_LOCKS_WIRE_VERSION: i32 = 8;

/// Whether a `listDatabases` filter is one leaf expression on `name` (`list_databases.cpp`:
/// `filter->isLeaf()` on 3.6, `getCategory() == kLeaf` from 4.0, and `path() == "name"`).
/// Fixes18b (review18 finding 5, TK-15, house rule 7), as the server's parser builds it
/// (`expression_parser.cpp`): the filter's only field is `name`, and its condition is one
/// expression that is a leaf. A value, a document whose first field is not an operator, or a
/// DBRef (`$ref` and `$id`) is an equality; in an operator document each operator is one
/// expression except `$options` beside a `$regex` (one regex expression together). `$eq`, the
/// order comparisons, `$in`, `$regex` and a true `$exists` are leaves; `$ne`, `$nin`, `$not` and
/// a false `$exists` are negations, `$size` and `$elemMatch` array expressions, `$all` a
/// conjunction, and two operators a conjunction too, so any of those locks every database. The
/// operators not named here are not leaves to the test server (it refuses them in a filter
/// before any lock). A top-level `$comment` beside it adds no expression ([`name_condition`]).
fn is_name_leaf(filter: &Document) -> bool {
    let Some(condition) = name_condition(filter) else {
        return false;
    };
    let Bson::Document(operators) = condition else {
        return true;
    };
    let dbref = operators.contains_key("$ref") && operators.contains_key("$id");
    if dbref || !operators.keys().next().is_some_and(|k| k.starts_with('$')) {
        return true;
    }
    let regex = operators.contains_key("$regex");
    let mut expressions = operators
        .iter()
        .filter(|(op, _)| !(regex && op.as_str() == "$options"));
    match (expressions.next(), expressions.next()) {
        (Some((op, operand)), None) => match op.as_str() {
            "$eq" | "$gt" | "$gte" | "$lt" | "$lte" | "$in" | "$regex" => true,
            "$exists" => crate::query::true_value(operand),
            _ => false,
        },
        _ => false,
    }
}

/// The condition on `name` of a filter whose one expression is on `name`. Review19 R4 (TK-15,
/// house rule 7): a top-level `$comment` is no expression, as fixes18c made it for
/// [`crate::query::matches`]: the server's parser adds nothing to the filter's conjunction for
/// it and unwraps a conjunction of one child to that child (`expression_parser.cpp`), so
/// `{name: "a", $comment: "x"}` is the same leaf as `{name: "a"}` to `list_databases.cpp` and
/// `list_collections.cpp`.
fn name_condition(filter: &Document) -> Option<&Bson> {
    let mut fields = filter.iter().filter(|(field, _)| *field != "$comment");
    match (fields.next(), fields.next()) {
        (Some((field, condition)), None) if field == "name" => Some(condition),
        _ => None,
    }
}

/// Docs13 (TK-15, house rule 7): the locks a `listCollections` takes before 5.0, in order: the
/// database's lock (`AutoGetDb`: IS, S on 3.6; [`DdlTarget::DatabaseLock`], which waits behind
/// a pending collection DDL before 4.2, as that DDL locks the database:
/// [`Store::collection_ddl_target`]), then each listed collection's IS lock. A filter on exact
/// names (`{name: <string>}`, `$eq`, `$in` without regexes: `_getExactNameMatches`) lists only
/// those names, any other every collection of the database. 4.4 and later lock each
/// collection in the list, `nameOnly` or not, an exactly named one even when it does not exist
/// (`Lock::CollectionLock` before the lookup, `catalog::forEachCollectionFromDb`); 4.0 and 4.2
/// only the existing ones, and only to describe them (`nameOnly: false`,
/// `buildCollectionBson`).
fn list_collections_locks(
    db: &str,
    command: &Document,
    name_only: bool,
    existing: &[String],
    max_wire_version: i32,
) -> Vec<DdlTarget> {
    let mut locks = vec![DdlTarget::DatabaseLock(db.to_owned())];
    let since_4_4 = max_wire_version >= 9;
    if name_only && !since_4_4 {
        return locks;
    }
    let listed: Vec<String> = match command.get_document("filter").ok().and_then(exact_names) {
        Some(names) if since_4_4 => names,
        Some(names) => names.into_iter().filter(|n| existing.contains(n)).collect(),
        None => existing.to_vec(),
    };
    locks.extend(
        listed
            .into_iter()
            .map(|c| DdlTarget::Collection(format!("{db}.{c}"))),
    );
    locks
}

/// The collection names a `listCollections` filter matches exactly, as the server's
/// `_getExactNameMatches` reads them (`list_collections.cpp`): a filter whose only field is
/// `name` (top-level `$comment`s aside, [`name_condition`]), equal to a string (`{name: s}`,
/// `{name: {$eq: s}}`) or in a list of strings without regexes (`{name: {$in: [...]}}`); an
/// empty or non-string name matches nothing. `None` for any other filter.
fn exact_names(filter: &Document) -> Option<Vec<String>> {
    let name_of = |value: &Bson| match value {
        Bson::String(s) if !s.is_empty() => Some(s.clone()),
        _ => None,
    };
    match name_condition(filter)? {
        Bson::Document(operators) if operators.keys().any(|k| k.starts_with('$')) => {
            match operators.iter().next() {
                Some((op, value)) if op == "$eq" && operators.len() == 1 => {
                    Some(name_of(value).into_iter().collect())
                }
                Some((op, Bson::Array(values))) if op == "$in" && operators.len() == 1 => {
                    if values
                        .iter()
                        .any(|v| matches!(v, Bson::RegularExpression(_)))
                    {
                        return None;
                    }
                    Some(values.iter().filter_map(name_of).collect())
                }
                _ => None,
            }
        }
        Bson::RegularExpression(_) => None,
        // An equality to anything but a non-empty string (a document too) names nothing.
        value => Some(name_of(value).into_iter().collect()),
    }
}

/// TK-2, TK-16: what a reply refuses for the unsupported log: a `TestkitUnsupported` reply, or
/// a fail point the server would not set (no test expects `configureFailPoint` to fail).
pub(crate) fn refusal(name: &str, reply: &Document) -> Option<String> {
    let refused = reply.get_i32("code").ok() == Some(TESTKIT_UNSUPPORTED)
        || (name == "configureFailPoint" && !retry_core::reply::is_ok(reply));
    refused.then(|| format!("{name}: {}", reply.get_str("errmsg").unwrap_or("")))
}

fn query_error(error: QueryError) -> Document {
    match error {
        QueryError::UnsupportedFilter(key) => match key.strip_prefix(crate::query::BAD_VALUE) {
            Some(message) => error_reply(2, message),
            None => unsupported_reply(&format!("query operator {key}")),
        },
        QueryError::CursorNotFound(id) => error_reply(43, &format!("cursor id {id} not found")),
        QueryError::CursorMismatch(code, message) => error_reply(code, &message),
        // TK-15: a real server's message. A write outside any transaction that is `Blocked` is
        // never answered so: the server undoes it, waits and runs it again (review7 finding 1).
        // Review7 finding 3: a real server's code and message (storage validation).
        QueryError::TooDeep => error_reply(
            15,
            &format!(
                "Document exceeds maximum nesting depth of {}",
                crate::store::MAX_STORED_DEPTH
            ),
        ),
        QueryError::Write(code, message) => error_reply(code, &message),
        QueryError::WriteConflict | QueryError::Blocked(_) => error_reply(
            112,
            "WriteConflict error: this operation conflicted with another operation. Please retry \
             your operation or multi-document transaction.",
        ),
    }
}

/// `batchSize`, or `default` when absent; `None` when present but not a non-negative integer.
fn batch_size(command: &Document, default: u32) -> Option<usize> {
    match command.get("batchSize") {
        None => Some(default as usize),
        Some(value) => integer(value).and_then(|v| usize::try_from(v).ok()),
    }
}

/// An integer in any numeric BSON type (an integral double included), as servers accept them.
pub(crate) fn integer(value: &Bson) -> Option<i64> {
    match value {
        Bson::Int32(v) => Some(i64::from(*v)),
        Bson::Int64(v) => Some(*v),
        Bson::Double(v) if v.fract() == 0.0 && v.abs() < 9.0e15 => Some(*v as i64),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ReplicaSetMember;
    use retry_core::address::ServerAddress;
    use retry_core::handshake::{validate_reply, HandshakeError};
    use retry_core::time::Instant;
    use retry_core::topology::ServerType;
    use std::time::Duration;

    /// TK-15 (review7 finding 5): a statement succeeded when `ok` is 1 in any number type or
    /// `true` (the rule of `retry_core::reply`) and it has no write error.
    #[test]
    fn tk15_review7_f5_a_statement_fails_by_the_one_ok_rule() {
        for ok in [
            Bson::Double(1.0),
            Bson::Int32(1),
            Bson::Int64(1),
            Bson::Boolean(true),
        ] {
            assert!(!statement_failed(&doc! { "ok": ok.clone() }), "{ok}");
            assert!(statement_failed(&doc! { "ok": ok, "writeErrors": [] }));
        }
        for not_ok in [Bson::Double(0.0), Bson::Int64(0), Bson::String("1".into())] {
            assert!(statement_failed(&doc! { "ok": not_ok }));
        }
    }

    fn context() -> HelloContext<'static> {
        HelloContext {
            me: "127.0.0.1:40000",
            process_id: ObjectId::from_bytes([1; 12]),
            service_id: ObjectId::from_bytes([1; 12]),
            connection_id: 3,
            min_wire_version: 0,
            max_wire_version: 25,
        }
    }

    /// The reply as retry-core's handshake sees it.
    fn validate(reply: &Document, load_balanced: bool) -> Result<ServerType, HandshakeError> {
        let address = ServerAddress::new("127.0.0.1", 40000);
        validate_reply(
            reply,
            &address,
            load_balanced,
            Duration::ZERO,
            Instant::ZERO,
        )
        .map(|r| r.description.server_type)
    }

    #[test]
    fn hello_replies_parse_as_their_role() {
        let hello = doc! { "hello": 1, "$db": "admin" };
        let legacy = doc! { "isMaster": 1, "helloOk": true, "$db": "admin" };
        let secondary = ReplicaSetMember {
            primary_host: Some("127.0.0.1:40001".into()),
            ..ReplicaSetMember::secondary("rs0")
        };
        let cases = [
            (Role::Standalone, ServerType::Standalone),
            (Role::Mongos, ServerType::Mongos),
            (
                Role::ReplicaSetMember(ReplicaSetMember::primary("rs0")),
                ServerType::RsPrimary,
            ),
            (Role::ReplicaSetMember(secondary), ServerType::RsSecondary),
        ];
        for (role, expected) in cases {
            let reply = hello_reply("hello", HelloAsk::of(&hello), &role, 0, &context());
            assert_eq!(validate(&reply, false), Ok(expected), "{role:?}");
            assert!(reply.contains_key("isWritablePrimary"));
            assert!(!reply.contains_key("helloOk"));
            let reply = hello_reply("isMaster", HelloAsk::of(&legacy), &role, 0, &context());
            assert_eq!(validate(&reply, false), Ok(expected), "{role:?}");
            assert!(reply.contains_key("ismaster"));
            assert_eq!(reply.get_bool("helloOk").ok(), Some(true));
        }
    }

    #[test]
    fn hello_reply_fields() {
        let role = Role::ReplicaSetMember(ReplicaSetMember::primary("rs0"));
        let reply = hello_reply(
            "hello",
            HelloAsk::of(&doc! { "hello": 1 }),
            &role,
            4,
            &context(),
        );
        assert_eq!(reply.get_str("setName").ok(), Some("rs0"));
        assert_eq!(reply.get_str("me").ok(), Some("127.0.0.1:40000"));
        assert_eq!(reply.get_str("primary").ok(), Some("127.0.0.1:40000"));
        assert_eq!(
            reply.get_array("hosts").unwrap(),
            &vec![Bson::from("127.0.0.1:40000")]
        );
        let version = reply.get_document("topologyVersion").unwrap();
        assert_eq!(version.get_i64("counter").ok(), Some(4));
        assert_eq!(reply.get_i32("connectionId").ok(), Some(3));
        assert_eq!(reply.get_i32("maxWireVersion").ok(), Some(25));
        assert_eq!(reply.get_i32("maxMessageSizeBytes").ok(), Some(48_000_000));
        assert_eq!(reply.get_i32("logicalSessionTimeoutMinutes").ok(), Some(30));
    }

    #[test]
    fn only_retryable_inserts_have_a_write_key() {
        let lsid = doc! { "id": 1 };
        let retryable = doc! { "insert": "c", "lsid": lsid.clone(), "txnNumber": 3_i64 };
        let key = write_key("insert", &retryable).unwrap();
        assert_eq!(key.txn_number, 3);
        assert_eq!(key.session, lsid.to_vec().unwrap());
        let in_transaction = doc! { "insert": "c", "lsid": { "id": 1 }, "txnNumber": 3_i64,
        "autocommit": false };
        assert_eq!(write_key("insert", &in_transaction), None);
        assert_eq!(
            write_key("insert", &doc! { "insert": "c", "txnNumber": 3_i64 }),
            None
        );
        assert_eq!(
            write_key("insert", &doc! { "insert": "c", "lsid": { "id": 1 } }),
            None
        );
        assert_eq!(write_key("find", &retryable), None);
    }

    #[test]
    fn load_balancer_service_id_only_when_asked_and_enabled() {
        let lb_hello = doc! { "hello": 1, "loadBalanced": true };
        let plain_hello = doc! { "hello": 1 };
        let on = Role::LoadBalancer { service_id: true };
        let off = Role::LoadBalancer { service_id: false };

        let reply = hello_reply("hello", HelloAsk::of(&lb_hello), &on, 0, &context());
        assert_eq!(
            reply.get_object_id("serviceId").ok(),
            Some(context().process_id),
            "LB-17: serviceId is the processId"
        );
        assert_eq!(validate(&reply, true), Ok(ServerType::Mongos));

        let reply = hello_reply("hello", HelloAsk::of(&plain_hello), &on, 0, &context());
        assert!(!reply.contains_key("serviceId"));

        let reply = hello_reply("hello", HelloAsk::of(&lb_hello), &off, 0, &context());
        assert_eq!(
            validate(&reply, true),
            Err(HandshakeError::LoadBalancerUnsupported)
        );
    }

    /// TK-2 (fixes11b's leftover): `distinct` answers as a real server: array elements count
    /// each, values equal in the server's comparison are one (the first seen), the reply lists
    /// them in BSON order; what the test server cannot order exactly is refused.
    #[test]
    fn tk2_distinct_dedups_and_orders_as_a_real_server() {
        let decimal = |text: &str| Bson::Decimal128(text.parse().expect("a decimal"));
        let found = [
            Bson::String("b".into()),
            Bson::Double(2.0),
            Bson::Array(vec![Bson::Int64(1), Bson::Int32(2)]),
            decimal("1"),
            Bson::Null,
            Bson::Int32(1),
            Bson::String("a".into()),
        ];
        assert_eq!(
            distinct_values(found.iter()),
            Ok(vec![
                Bson::Null,
                Bson::Int64(1),
                Bson::Double(2.0),
                Bson::String("a".into()),
                Bson::String("b".into()),
            ])
        );
        let one_document = [Bson::Document(doc! { "x": 1 })];
        assert_eq!(
            distinct_values(one_document.iter()),
            Ok(one_document.to_vec())
        );
        for refused in [
            vec![decimal("1.5"), Bson::Double(1.5)],
            vec![Bson::Document(doc! { "x": 1 }), Bson::Int32(1)],
            vec![Bson::Array(vec![Bson::Array(vec![]), Bson::Int32(1)])],
            vec![Bson::Array(vec![])],
        ] {
            assert!(distinct_values(refused.iter()).is_err(), "{refused:?}");
        }
    }

    /// Review13 finding 2 (TK-2, house rule 7): the arms of [`run`], listed once here.
    const DISPATCHED: &[&str] = &[
        "ping",
        "endSessions",
        "killAllSessions",
        "killSessions",
        "buildInfo",
        "buildinfo",
        "insert",
        "update",
        "delete",
        "findAndModify",
        "bulkWrite",
        "count",
        "distinct",
        "aggregate",
        "create",
        "drop",
        "dropDatabase",
        "listCollections",
        "listDatabases",
        "listIndexes",
        "createIndexes",
        "dropIndexes",
        "deleteIndexes",
        "commitTransaction",
        "abortTransaction",
        "find",
        "getMore",
        "killCursors",
    ];

    /// The known commands other handlers run: hellos (the server), the authentication commands
    /// (`auth`), `configureFailPoint` and `setParameter` ([`execute`]).
    const RUN_ELSEWHERE: &[&str] = &[
        "hello",
        "isMaster",
        "ismaster",
        "saslStart",
        "saslContinue",
        "authenticate",
        "configureFailPoint",
        "setParameter",
    ];

    /// What [`run`] answers `{<name>: "c", $db: "db"}` on a server of `max_wire_version`.
    fn dispatch(store: &mut Store, name: &str, max_wire_version: i32) -> Option<Document> {
        let request = OpMsg {
            request_id: 1,
            response_to: 0,
            flags: Default::default(),
            body: doc! { name: "c", "$db": "db" },
            sequences: Vec::new(),
        };
        let mut context = Context {
            store,
            batch_size: 101,
            origin: CursorOrigin {
                owner: ObjectId::from_bytes([1; 12]),
                lsid: None,
                txn_number: None,
                api: ApiParameters::NONE,
                router: false,
            },
            router: None,
            as_sent: &[],
        };
        run(&mut context, name, &request, max_wire_version)
    }

    /// Review13 finding 2 (TK-2, house rule 7): the known commands
    /// (`refusals::known_command`, which gates every API check and answers 59 for the rest) and
    /// the commands the test server runs stay in step: every arm of [`run`] is known and runs,
    /// every known command is run by [`run`] or another handler or listed as known but not run,
    /// and `bulkWrite` is known and run only from wire version 25 (8.0; a 7.0 server answers 59,
    /// not an API error).
    #[test]
    fn review13_f2_tk2_known_commands_and_the_dispatcher_stay_in_step() {
        use crate::refusals::{known_command, API_VERSION_1, KNOWN_OUTSIDE_API_VERSION_1};
        let mut store = Store::default();
        for name in DISPATCHED {
            assert!(known_command(name, 25), "{name} runs but is unknown");
            assert!(dispatch(&mut store, name, 25).is_some(), "{name} not run");
        }
        for name in API_VERSION_1.iter().chain(KNOWN_OUTSIDE_API_VERSION_1) {
            let run_somewhere = DISPATCHED.contains(name) || RUN_ELSEWHERE.contains(name);
            let listed = run_somewhere || KNOWN_NOT_RUN.contains(name);
            assert!(listed, "{name} is known but nothing runs it");
        }
        // Leftovers12 item 6: the dispatcher's own list of what it does not run.
        for name in KNOWN_NOT_RUN {
            assert!(known_command(name, 25), "{name}");
            assert!(dispatch(&mut store, name, 25).is_none(), "{name} is run");
        }
        let no_handler = |reply: Option<Document>| {
            reply.is_some_and(|r| {
                r.get_i32("code").ok() == Some(crate::TESTKIT_UNSUPPORTED)
                    && r.get_str("errmsg")
                        .is_ok_and(|m| m.ends_with("without a handler"))
            })
        };
        for name in RUN_ELSEWHERE {
            assert!(known_command(name, 25), "{name}");
            assert!(
                no_handler(dispatch(&mut store, name, 25)),
                "{name} is run twice"
            );
        }
        assert!(!known_command("bulkWrite", 21));
        assert!(no_handler(dispatch(&mut store, "bulkWrite", 21)));
        assert!(!known_command("frobnicate", 25));
        assert!(no_handler(dispatch(&mut store, "frobnicate", 25)));
    }

    /// Fixes18b (review18 finding 5, TK-15, house rule 7): the `listDatabases` filters that
    /// name databases without locking the others are those the server parses into one leaf
    /// expression on `name` (`expression_parser.cpp`, `list_databases.cpp`): `$regex` with its
    /// `$options` is one regex expression; a negation (`$ne`, `$nin`, `$not`, a false
    /// `$exists`), an array expression (`$size`, `$elemMatch`), `$all` and two operators are
    /// not leaves.
    #[test]
    fn review18_f5_tk15_list_databases_name_leaves_are_the_servers() {
        let dbref = doc! { "$ref": "c", "$id": 1 };
        let leaves = [
            doc! { "name": "a" },
            doc! { "name": { "$eq": "a" } },
            doc! { "name": { "$gt": "a" } },
            doc! { "name": { "$in": ["a", "b"] } },
            doc! { "name": { "$regex": "^a" } },
            doc! { "name": { "$regex": "^a", "$options": "i" } },
            doc! { "name": { "$options": "i", "$regex": "^a" } },
            doc! { "name": { "$exists": true } },
            doc! { "name": { "$exists": 1 } },
            doc! { "name": { "a": 1, "$b": 2 } },
            doc! { "name": dbref },
            doc! { "name": {} },
        ];
        for filter in &leaves {
            assert!(is_name_leaf(filter), "a leaf on name: {filter}");
        }
        let not_leaves = [
            doc! { "name": { "$ne": "a" } },
            doc! { "name": { "$nin": ["a"] } },
            doc! { "name": { "$not": { "$eq": "a" } } },
            doc! { "name": { "$exists": false } },
            doc! { "name": { "$exists": 0 } },
            doc! { "name": { "$exists": Bson::Null } },
            doc! { "name": { "$size": 1 } },
            doc! { "name": { "$elemMatch": { "$eq": "a" } } },
            doc! { "name": { "$all": ["a"] } },
            doc! { "name": { "$all": ["a", "b"] } },
            doc! { "name": { "$gt": "a", "$lt": "c" } },
            doc! { "name": "a", "x": 1 },
            doc! { "x": "a" },
            doc! { "$or": [{ "name": "a" }] },
        ];
        for filter in &not_leaves {
            assert!(!is_name_leaf(filter), "not a leaf on name: {filter}");
        }
    }

    /// Review19 R5 (TK-15, house rule 7): which aggregate cursors a 4.2 / 4.4 server answers
    /// with its query layer alone is decided after its pipeline optimization: a `$match`
    /// after a limitless `$sort` moves in front of it (`pushMatchBefore`), adjacent `$limit`s
    /// merge (`DocumentSourceLimit::doOptimizeAt`), an empty `$match` and a `$skip` of 0 go;
    /// a `$match` after a `$limit` or a `$skip` stays where it is.
    #[test]
    fn review19_r5_tk15_optimized_away_after_the_servers_reordering() {
        let by_id = Bson::Document(doc! { "_id": 1 });
        let by_x = Bson::Document(doc! { "x": 1 });
        let filter = Bson::Document(doc! { "_id": { "$gte": 1 } });
        let empty = Bson::Document(doc! {});
        let (five, three, zero) = (Bson::Int32(5), Bson::Int32(3), Bson::Int32(0));
        let away = |stages: &[(&str, &Bson)], wire: i32| optimized_away(stages, wire);
        // 4.2: a `$sort` on `_id` with the `$match` it was sent before.
        assert!(away(&[("$sort", &by_id), ("$match", &filter)], 8));
        assert!(away(
            &[("$sort", &by_id), ("$match", &filter), ("$match", &filter)],
            8
        ));
        assert!(away(&[("$sort", &by_id), ("$match", &empty)], 8));
        assert!(away(&[("$skip", &zero)], 8));
        assert!(!away(&[("$sort", &by_x), ("$match", &filter)], 8));
        assert!(!away(
            &[("$sort", &by_id), ("$limit", &five), ("$match", &filter)],
            8
        ));
        assert!(!away(&[("$limit", &five), ("$limit", &three)], 8));
        // 4.4: any `$sort`, and merged `$limit`s.
        assert!(away(&[("$sort", &by_x), ("$match", &filter)], 9));
        assert!(away(
            &[("$sort", &by_x), ("$match", &filter), ("$limit", &five)],
            12
        ));
        assert!(away(&[("$limit", &five), ("$limit", &three)], 9));
        assert!(away(
            &[("$sort", &by_x), ("$limit", &five), ("$limit", &three)],
            9
        ));
        assert!(away(
            &[("$limit", &five), ("$match", &empty), ("$limit", &three)],
            9
        ));
        assert!(!away(&[("$limit", &five), ("$match", &filter)], 9));
        assert!(!away(&[("$skip", &three), ("$limit", &five)], 9));
        assert!(!away(
            &[("$sort", &by_x), ("$limit", &five), ("$match", &filter)],
            9
        ));
        // Before 4.2 a pipeline always runs; from 5.0 reads take no lock.
        assert!(!away(&[("$sort", &by_id), ("$match", &filter)], 7));
        assert!(!away(&[("$limit", &five), ("$limit", &three)], 13));
    }

    /// Review21 R2 (TK-15, house rule 7): a 4.4 server's query layer takes, after the leading
    /// `$match`es and a leading `$sort` (with the `$limit`s it absorbed over stages that swap
    /// with a limit) or the `$limit`s `extractLimitForPushdown` takes from the front, one
    /// leading inclusion `$project` (`buildProjectionForPushdown`), and a `$match` after an
    /// inclusion `$project` that keeps every field it reads moves in front of it
    /// (`pushMatchBefore`). 4.2 takes no `$project`.
    #[test]
    fn review21_r2_tk15_a_leading_inclusion_project_is_pushed_on_4_4() {
        let by_x = Bson::Document(doc! { "x": 1 });
        let include_a = Bson::Document(doc! { "a": 1 });
        let only_id = Bson::Document(doc! { "_id": true });
        let a_without_id = Bson::Document(doc! { "a": 1, "_id": 0 });
        let exclude_a = Bson::Document(doc! { "a": 0 });
        let exclude_id = Bson::Document(doc! { "_id": 0 });
        let on_a = Bson::Document(doc! { "a.b": { "$gt": 1 } });
        let on_id = Bson::Document(doc! { "_id": 1 });
        let on_b = Bson::Document(doc! { "b": 1 });
        let either = Bson::Document(doc! { "$or": [{ "a": 1 }, { "_id": 2 }], "$comment": "c" });
        let either_b = Bson::Document(doc! { "$or": [{ "a": 1 }, { "b": 2 }] });
        let (five, two) = (Bson::Int32(5), Bson::Int32(2));
        let away = |stages: &[(&str, &Bson)], wire: i32| optimized_away(stages, wire);
        for wire in 9..=12 {
            let away = |stages: &[(&str, &Bson)]| away(stages, wire);
            // The review's example: the `$limit` is absorbed by the `$sort` over the `$project`.
            assert!(away(&[
                ("$sort", &by_x),
                ("$project", &include_a),
                ("$limit", &five)
            ]));
            assert!(away(&[("$project", &include_a)]));
            assert!(away(&[("$project", &only_id)]));
            assert!(away(&[("$match", &on_b), ("$project", &a_without_id)]));
            assert!(away(&[("$limit", &five), ("$project", &include_a)]));
            assert!(away(&[("$project", &include_a), ("$limit", &five)]));
            assert!(away(&[
                ("$limit", &five),
                ("$project", &include_a),
                ("$limit", &two)
            ]));
            assert!(away(&[
                ("$sort", &by_x),
                ("$limit", &five),
                ("$project", &include_a)
            ]));
            // A `$match` on kept fields moves in front of the `$project` (and a `$sort`).
            assert!(away(&[("$project", &include_a), ("$match", &on_a)]));
            assert!(away(&[("$project", &include_a), ("$match", &on_id)]));
            assert!(away(&[("$project", &include_a), ("$match", &either)]));
            assert!(away(&[
                ("$sort", &by_x),
                ("$project", &include_a),
                ("$match", &on_a)
            ]));
            // ... not one on a field it drops, nor one after a `$limit`.
            assert!(!away(&[("$project", &include_a), ("$match", &on_b)]));
            assert!(!away(&[("$project", &include_a), ("$match", &either_b)]));
            assert!(!away(&[("$project", &a_without_id), ("$match", &on_id)]));
            assert!(!away(&[
                ("$project", &include_a),
                ("$limit", &five),
                ("$match", &on_a)
            ]));
            // Only one inclusion `$project`, at the front once the `$sort` is taken.
            assert!(!away(&[("$project", &exclude_a)]));
            assert!(!away(&[("$project", &exclude_id)]));
            assert!(!away(&[("$addFields", &include_a), ("$limit", &five)]));
            assert!(!away(&[("$project", &include_a), ("$project", &include_a)]));
            assert!(!away(&[("$project", &include_a), ("$sort", &by_x)]));
            assert!(!away(&[("$skip", &two), ("$project", &include_a)]));
            assert!(!away(&[
                ("$sort", &by_x),
                ("$project", &include_a),
                ("$skip", &two),
                ("$limit", &five)
            ]));
            assert!(!away(&[
                ("$sort", &by_x),
                ("$project", &include_a),
                ("$sort", &by_x)
            ]));
        }
        assert!(!away(&[("$project", &include_a)], 8));
        assert!(!away(&[("$project", &include_a)], 13));
        // `{_id: 1}` alone is an inclusion projection: it keeps `_id` only.
        let documents = vec![doc! { "_id": 1, "a": 2 }];
        let projected = project(documents, &doc! { "_id": 1 }, false);
        assert_eq!(projected, Ok(vec![doc! { "_id": 1 }]));
    }

    /// Review21 R6 (house rule 7, 11): a `$skip` / `$limit` argument is refused as the
    /// server parses it (4.2 / 4.4 `document_source_skip.cpp` / `document_source_limit.cpp`;
    /// from 5.0 `parseIntegerElementToNonNegativeLong`), never run as 0 or as no limit.
    #[test]
    fn review21_r6_skip_and_limit_arguments_are_refused_as_the_server_parses_them() {
        let parse = |stage: &str, value: Bson, wire: i32| {
            count_argument(stage, &value, wire).map_err(|reply| {
                let message = reply.get_str("errmsg").unwrap_or_default().to_owned();
                (reply.get_i32("code").unwrap_or_default(), message)
            })
        };
        let refused = |code: i32, message: &str| Err((code, message.to_owned()));
        for wire in [6, 8, 9, 12] {
            assert_eq!(parse("$limit", Bson::Int32(5), wire), Ok(5));
            assert_eq!(parse("$skip", Bson::Int64(0), wire), Ok(0));
            // `numberLong` cuts a double toward zero.
            assert_eq!(parse("$limit", Bson::Double(2.5), wire), Ok(2));
            assert_eq!(parse("$skip", Bson::Double(-0.5), wire), Ok(0));
            let positive = refused(15958, "the limit must be positive");
            assert_eq!(parse("$limit", Bson::Int32(0), wire), positive);
            assert_eq!(parse("$limit", Bson::Int64(-3), wire), positive);
            assert_eq!(parse("$limit", Bson::Double(0.5), wire), positive);
            assert_eq!(parse("$limit", Bson::Double(f64::NAN), wire), positive);
            assert_eq!(parse("$limit", Bson::Double(1e19), wire), positive);
            assert_eq!(
                parse("$limit", Bson::String("5".into()), wire),
                refused(15957, "the limit must be specified as a number")
            );
            assert_eq!(
                parse("$limit", Bson::Null, wire),
                refused(15957, "the limit must be specified as a number")
            );
            let negative = refused(15956, "Argument to $skip cannot be negative");
            assert_eq!(parse("$skip", Bson::Int32(-1), wire), negative);
            assert_eq!(parse("$skip", Bson::Double(f64::INFINITY), wire), negative);
            assert_eq!(
                parse("$skip", Bson::String("1".into()), wire),
                refused(15972, "Argument to $skip must be a number not a string")
            );
            assert_eq!(
                parse("$skip", Bson::Boolean(true), wire),
                refused(15972, "Argument to $skip must be a number not a bool")
            );
        }
        for wire in [13, 25] {
            assert_eq!(parse("$limit", Bson::Double(5.0), wire), Ok(5));
            assert_eq!(parse("$skip", Bson::Int32(0), wire), Ok(0));
            assert_eq!(
                parse("$limit", Bson::Int32(0), wire),
                refused(15958, "the limit must be positive")
            );
            assert_eq!(
                parse("$limit", Bson::Int32(-1), wire),
                refused(
                    5107201,
                    "invalid argument to $limit stage: Expected a non-negative number in: \
                     $limit: -1"
                )
            );
            assert_eq!(
                parse("$limit", Bson::Double(2.5), wire),
                refused(
                    5107201,
                    "invalid argument to $limit stage: Expected an integer: $limit: 2.5"
                )
            );
            assert_eq!(
                parse("$skip", Bson::Double(-2.0), wire),
                refused(
                    5107200,
                    "invalid argument to $skip stage: Expected a non-negative number in: \
                     $skip: -2.0"
                )
            );
            assert_eq!(
                parse("$skip", Bson::Double(f64::NAN), wire),
                refused(
                    5107200,
                    "invalid argument to $skip stage: Expected an integer, but found NaN in: \
                     $skip: nan.0"
                )
            );
            assert_eq!(
                parse("$skip", Bson::Double(1e19), wire).map_err(|(code, _)| code),
                Err(5107200)
            );
            assert_eq!(
                parse("$skip", Bson::String("a".into()), wire),
                refused(
                    5107200,
                    "invalid argument to $skip stage: Expected a number in: $skip: \"a\""
                )
            );
        }
        let decimal = Bson::Decimal128("5".parse().expect("a decimal"));
        assert_eq!(
            parse("$limit", decimal, 25).map_err(|(code, _)| code),
            Err(TESTKIT_UNSUPPORTED)
        );
    }

    /// Review21 R1 (TK-15, house rule 7): 4.4's `DocumentSourceSort::doOptimizeAt` erases a
    /// `$sort` followed by another `$sort` (keeping the lower of their limits, so also across
    /// a `$limit` the first absorbed), and the query layer then takes the one left: on wire
    /// 9-12 such a pipeline is optimized away. 4.2 does not merge them; merging there too only
    /// makes more cursors queue (stricter).
    #[test]
    fn review21_r1_tk15_adjacent_sorts_merge_before_the_query_layer_takes_one() {
        let by_id = Bson::Document(doc! { "_id": 1 });
        let by_x = Bson::Document(doc! { "x": 1 });
        let by_y = Bson::Document(doc! { "y": -1 });
        let filter = Bson::Document(doc! { "_id": { "$gte": 1 } });
        let (five, three) = (Bson::Int32(5), Bson::Int32(3));
        let away = |stages: &[(&str, &Bson)], wire: i32| optimized_away(stages, wire);
        for wire in 9..=12 {
            assert!(away(&[("$sort", &by_x), ("$sort", &by_y)], wire));
            assert!(away(
                &[("$sort", &by_x), ("$limit", &five), ("$sort", &by_y)],
                wire
            ));
            assert!(away(
                &[
                    ("$sort", &by_x),
                    ("$limit", &five),
                    ("$sort", &by_y),
                    ("$limit", &three)
                ],
                wire
            ));
            assert!(away(
                &[("$sort", &by_x), ("$sort", &by_y), ("$sort", &by_id)],
                wire
            ));
            // A `$match` between them moves in front of both first.
            assert!(away(
                &[("$sort", &by_x), ("$match", &filter), ("$sort", &by_y)],
                wire
            ));
            // A `$match` after a `$sort` that absorbed a `$limit` stays between them.
            assert!(!away(
                &[
                    ("$sort", &by_x),
                    ("$limit", &five),
                    ("$match", &filter),
                    ("$sort", &by_y)
                ],
                wire
            ));
        }
        // 4.2 takes only a `$sort` on `_id`: the later one is what is left.
        assert!(away(&[("$sort", &by_x), ("$sort", &by_id)], 8));
        assert!(!away(&[("$sort", &by_id), ("$sort", &by_x)], 8));
        assert!(!away(
            &[("$sort", &by_x), ("$limit", &five), ("$sort", &by_id)],
            8
        ));
    }

    /// Review19 R4 (TK-15, house rule 7): a top-level `$comment` adds no expression to a
    /// filter (`expression_parser.cpp`: `parseComment` gives none, and a conjunction of one
    /// child is that child), so beside one expression on `name` the filter is still a leaf
    /// for `listDatabases` and still names its collections exactly for `listCollections`;
    /// alone, or beside another field, it is neither.
    #[test]
    fn review19_r4_tk15_a_top_level_comment_is_no_filter_field() {
        let leaves = [
            doc! { "name": "a", "$comment": "x" },
            doc! { "$comment": { "why": 1 }, "name": { "$in": ["a", "b"] } },
            doc! { "$comment": "x", "name": { "$regex": "^a" } },
        ];
        for filter in &leaves {
            assert!(is_name_leaf(filter), "a leaf on name: {filter}");
        }
        let not_leaves = [
            doc! { "$comment": "x" },
            doc! { "$comment": "x", "name": "a", "x": 1 },
            doc! { "name": { "$ne": "a" }, "$comment": "x" },
        ];
        for filter in &not_leaves {
            assert!(!is_name_leaf(filter), "not a leaf on name: {filter}");
        }
        let names = |filter: Document| exact_names(&filter);
        assert_eq!(
            names(doc! { "name": "c", "$comment": "x" }),
            Some(vec!["c".into()])
        );
        assert_eq!(
            names(doc! { "$comment": 1, "name": { "$in": ["c", "d"] } }),
            Some(vec!["c".into(), "d".into()])
        );
        assert_eq!(names(doc! { "$comment": "x" }), None);
        assert_eq!(names(doc! { "$comment": "x", "name": "c", "y": 1 }), None);
        assert_eq!(names(doc! { "name": { "$comment": "x" } }), None);
    }

    /// Review22 R2 (house rules 7 and 11): a dotted projection path, or inclusion mixed with
    /// exclusion, is TestkitUnsupported in [`project`] (a `find` projection reaches it), never a
    /// document cut to `{_id}` or a silent guess; an `aggregate` `$project` is refused before,
    /// with the server's codes ([`projection_argument`]), so [`optimized_away`] never reads one.
    #[test]
    fn review22_r2_a_dotted_or_mixed_projection_is_refused_not_run_wrong() {
        let documents = || vec![doc! { "_id": 1, "a": { "b": 1, "c": 2 }, "d": 3 }];
        let refused = |spec: Document| {
            let reply = project(documents(), &spec, false).expect_err("refused");
            reply.get_i32("code").ok()
        };
        assert_eq!(refused(doc! { "a.b": 1 }), Some(TESTKIT_UNSUPPORTED));
        assert_eq!(refused(doc! { "a.b": 0 }), Some(TESTKIT_UNSUPPORTED));
        assert_eq!(refused(doc! { "a": 1, "d": 0 }), Some(TESTKIT_UNSUPPORTED));
        assert_eq!(
            refused(doc! { "a": 0, "d": true }),
            Some(TESTKIT_UNSUPPORTED)
        );
        let kept = project(documents(), &doc! { "_id": 0, "d": 1 }, false);
        assert_eq!(kept, Ok(vec![doc! { "d": 3 }]));
        let dropped = project(documents(), &doc! { "_id": 1, "a": 0 }, false);
        assert_eq!(dropped, Ok(vec![doc! { "_id": 1, "d": 3 }]));
        let parse = |spec: Document, wire: i32| {
            projection_argument("$project", &Bson::Document(spec), wire)
                .map_err(|reply| reply.get_i32("code").unwrap_or_default())
        };
        for wire in [6, 8, 9, 13, 25] {
            assert_eq!(parse(doc! { "a.b": 1 }, wire), Err(TESTKIT_UNSUPPORTED));
            assert_eq!(parse(doc! { "a": "$d" }, wire), Err(TESTKIT_UNSUPPORTED));
            assert_eq!(parse(doc! { "a": 1, "_id": 0 }, wire), Ok(()));
        }
        // The mix is named as the server names it: the first field of the other kind.
        let mixed = projection_argument("$project", &Bson::Document(doc! { "a": 1, "d": 0 }), 9);
        let message = mixed.expect_err("refused");
        assert_eq!(
            message.get_str("errmsg").ok(),
            Some(
                "Invalid $project :: caused by :: Cannot do exclusion on field d in inclusion \
                projection"
            )
        );
    }
}
