//! The commands the server runs once a request is admitted: hello, ping, the in-memory CRUD
//! subset, `configureFailPoint` and a few no-ops.

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};

use crate::config::{
    Role, LOGICAL_SESSION_TIMEOUT_MINUTES, MAX_BSON_OBJECT_SIZE, MAX_MESSAGE_SIZE_BYTES,
    MAX_WRITE_BATCH_SIZE,
};
use crate::fail_point::{error_reply, FailCommand};
use crate::server::State;
use crate::store::{Batch, QueryError, WriteKey};
use retry_core::wire::OpMsg;

/// The `electionId` a primary reports; constant, since the test server never holds an election.
const ELECTION_ID: [u8; 12] = [0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 1];

/// The version `buildInfo` reports.
const VERSION: &str = "8.2.0";

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

/// The identity of a retryable `insert` (the one write the server runs), when it is one: a retry
/// with the same `lsid` and `txnNumber` gets the first reply and does not run again.
pub(crate) fn write_key(name: &str, command: &Document) -> Option<WriteKey> {
    if name != "insert" || !is_retryable_write(name, command) {
        return None;
    }
    let session = command.get_document("lsid").ok()?.to_vec().ok()?;
    let txn_number = command.get("txnNumber").and_then(integer)?;
    Some(WriteKey {
        session,
        txn_number,
    })
}

/// What a hello reply depends on besides the server's state.
pub(crate) struct HelloContext<'a> {
    /// The server's `host:port`, for `me`.
    pub(crate) me: &'a str,
    /// `topologyVersion.processId`, also the `serviceId` (LB-17).
    pub(crate) process_id: ObjectId,
    /// The connection's id.
    pub(crate) connection_id: i32,
    /// `minWireVersion`.
    pub(crate) min_wire_version: i32,
    /// `maxWireVersion`.
    pub(crate) max_wire_version: i32,
}

/// HS-3, HS-4, LB-8: the reply to `hello` / legacy hello in `role`.
///
/// `isWritablePrimary` answers `hello` and `ismaster` answers legacy hello; `helloOk: true` only
/// when the request carried it. A load balancer adds `serviceId` only when the request carried
/// `loadBalanced: true` and its `service_id` switch is on.
pub(crate) fn hello_reply(
    name: &str,
    command: &Document,
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
    if matches!(command.get("helloOk"), Some(Bson::Boolean(true))) {
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
            if *service_id && matches!(command.get("loadBalanced"), Some(Bson::Boolean(true))) {
                reply.insert("serviceId", context.process_id);
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
pub(crate) fn execute(state: &mut State, name: &str, request: &OpMsg) -> Option<Document> {
    let command = &request.body;
    let db = command.get_str("$db").unwrap_or_default();
    Some(match name {
        "ping" | "endSessions" => ok(),
        "buildInfo" | "buildinfo" => doc! {
            "version": VERSION,
            "versionArray": [8, 2, 0, 0],
            "maxBsonObjectSize": MAX_BSON_OBJECT_SIZE,
            "ok": 1.0,
        },
        "configureFailPoint" => match FailCommand::from_command(command) {
            Ok(fail) => {
                state.fail_point = fail;
                ok()
            }
            Err(e) => error_reply(2, &e.to_string()),
        },
        "insert" => insert(state, db, request),
        "find" => find(state, db, command),
        "getMore" => get_more(state, db, command),
        "killCursors" => kill_cursors(state, db, command),
        _ => return None,
    })
}

fn ok() -> Document {
    doc! { "ok": 1.0 }
}

/// `{insert: coll, documents: [...]}`, the documents in the body or in a kind-1 sequence.
fn insert(state: &mut State, db: &str, request: &OpMsg) -> Document {
    let Ok(collection) = request.body.get_str("insert") else {
        return error_reply(2, "insert needs a collection name");
    };
    let mut documents = Vec::new();
    if let Ok(array) = request.body.get_array("documents") {
        for item in array {
            let Bson::Document(d) = item else {
                return error_reply(2, "insert documents must be documents");
            };
            documents.push(d.clone());
        }
    }
    for sequence in &request.sequences {
        if sequence.identifier == "documents" {
            documents.extend(sequence.documents.iter().cloned());
        }
    }
    let n = state.store.insert(&format!("{db}.{collection}"), documents);
    doc! { "n": i32::try_from(n).unwrap_or(i32::MAX), "ok": 1.0 }
}

/// `{find: coll, filter, batchSize, limit, singleBatch}`: top-level equality filters only.
fn find(state: &mut State, db: &str, command: &Document) -> Document {
    let Ok(collection) = command.get_str("find") else {
        return error_reply(2, "find needs a collection name");
    };
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
    let single_batch = matches!(command.get("singleBatch"), Some(Bson::Boolean(true)));
    match state.store.find(&ns, &filter, limit, batch_size) {
        Ok(mut batch) => {
            if single_batch && batch.cursor_id != 0 {
                state.store.kill_cursors(&ns, &[batch.cursor_id]);
                batch.cursor_id = 0;
            }
            cursor_reply("firstBatch", &ns, batch)
        }
        Err(e) => query_error(e),
    }
}

/// `{getMore: id, collection, batchSize}`.
fn get_more(state: &mut State, db: &str, command: &Document) -> Document {
    let Some(id) = command.get("getMore").and_then(integer) else {
        return error_reply(2, "getMore needs a cursor id");
    };
    let Ok(collection) = command.get_str("collection") else {
        return error_reply(2, "getMore needs a collection name");
    };
    let Some(batch_size) = batch_size(command, state.batch_size) else {
        return error_reply(2, "batchSize must be a non-negative integer");
    };
    let ns = format!("{db}.{collection}");
    match state.store.get_more(&ns, id, batch_size) {
        Ok(batch) => cursor_reply("nextBatch", &ns, batch),
        Err(e) => query_error(e),
    }
}

/// `{killCursors: coll, cursors: [ids]}`.
fn kill_cursors(state: &mut State, db: &str, command: &Document) -> Document {
    let Ok(collection) = command.get_str("killCursors") else {
        return error_reply(2, "killCursors needs a collection name");
    };
    let Ok(cursors) = command.get_array("cursors") else {
        return error_reply(2, "killCursors needs an array of cursor ids");
    };
    let Some(ids) = cursors.iter().map(integer).collect::<Option<Vec<i64>>>() else {
        return error_reply(2, "cursor ids must be integers");
    };
    let (killed, not_found) = state
        .store
        .kill_cursors(&format!("{db}.{collection}"), &ids);
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

fn query_error(error: QueryError) -> Document {
    match error {
        QueryError::UnsupportedFilter(key) => error_reply(
            2,
            &format!("the test server supports equality filters only, not {key}"),
        ),
        QueryError::CursorNotFound(id) => error_reply(43, &format!("cursor id {id} not found")),
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

    fn context() -> HelloContext<'static> {
        HelloContext {
            me: "127.0.0.1:40000",
            process_id: ObjectId::from_bytes([1; 12]),
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
            let reply = hello_reply("hello", &hello, &role, 0, &context());
            assert_eq!(validate(&reply, false), Ok(expected), "{role:?}");
            assert!(reply.contains_key("isWritablePrimary"));
            assert!(!reply.contains_key("helloOk"));
            let reply = hello_reply("isMaster", &legacy, &role, 0, &context());
            assert_eq!(validate(&reply, false), Ok(expected), "{role:?}");
            assert!(reply.contains_key("ismaster"));
            assert_eq!(reply.get_bool("helloOk").ok(), Some(true));
        }
    }

    #[test]
    fn hello_reply_fields() {
        let role = Role::ReplicaSetMember(ReplicaSetMember::primary("rs0"));
        let reply = hello_reply("hello", &doc! { "hello": 1 }, &role, 4, &context());
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

        let reply = hello_reply("hello", &lb_hello, &on, 0, &context());
        assert_eq!(
            reply.get_object_id("serviceId").ok(),
            Some(context().process_id),
            "LB-17: serviceId is the processId"
        );
        assert_eq!(validate(&reply, true), Ok(ServerType::Mongos));

        let reply = hello_reply("hello", &plain_hello, &on, 0, &context());
        assert!(!reply.contains_key("serviceId"));

        let reply = hello_reply("hello", &lb_hello, &off, 0, &context());
        assert_eq!(
            validate(&reply, true),
            Err(HandshakeError::LoadBalancerUnsupported)
        );
    }
}
