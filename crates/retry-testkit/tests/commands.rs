//! The test server's command set and fail point modes (TK-*), over a real connection on
//! 127.0.0.1. Every test is bounded.

use std::future::Future;
use std::time::Duration;

use bson::{bson, doc, Bson, Document};
use retry_testkit::{RawClient, ServerConfig, TestServer, TESTKIT_UNSUPPORTED};

async fn bounded<F: Future<Output = ()>>(body: F) {
    tokio::time::timeout(Duration::from_secs(20), body)
        .await
        .expect("the test finished within its bound");
}

/// A mongos: retryable writes and transactions need a replica-set member or a mongos.
async fn start() -> (TestServer, RawClient) {
    let server = TestServer::start(ServerConfig::new(retry_testkit::Role::Mongos))
        .await
        .expect("server starts");
    let client = RawClient::connect(server.address())
        .await
        .expect("client connects");
    (server, client)
}

/// A one-member replica set's primary: a standalone refuses `txnNumber` (code 20), as a real one
/// does.
async fn start_primary() -> (TestServer, RawClient) {
    let server = TestServer::start_replica_set("rs0", 1, ServerConfig::default())
        .await
        .expect("replica set starts")
        .remove(0);
    let client = RawClient::connect(server.address())
        .await
        .expect("client connects");
    (server, client)
}

/// Two mongoses sharing one data store, and a client of each.
async fn start_two_mongoses() -> (Vec<TestServer>, RawClient, RawClient) {
    let servers = TestServer::start_mongoses(2, ServerConfig::default())
        .await
        .expect("mongoses start");
    let first = RawClient::connect(servers[0].address()).await.unwrap();
    let second = RawClient::connect(servers[1].address()).await.unwrap();
    (servers, first, second)
}

/// An `lsid` as a real server takes it: `{id: <UUID>}`, the UUID's bytes all `n`.
fn lsid_of(n: u8) -> Document {
    doc! { "id": Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![n; 16] }) }
}

/// An `lsid` as a real server takes it: `{id: <UUID>}`.
fn lsid() -> Document {
    doc! { "id": Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![1; 16] }) }
}

/// TX-1: `body` as a statement of transaction `txn` of the session `lsid` (`autocommit: false`),
/// the transaction's first when `start`.
fn in_transaction(mut body: Document, lsid: &Document, txn: i64, start: bool) -> Document {
    body.insert("lsid", lsid.clone());
    body.insert("txnNumber", txn);
    body.insert("autocommit", false);
    if start {
        body.insert("startTransaction", true);
    }
    body
}

/// TX-1: `command` (`commitTransaction` or `abortTransaction`) for transaction 1 of the session
/// `lsid_of(lsid)`.
fn end_transaction(command: &str, lsid: u8) -> Document {
    in_transaction(
        doc! { command: 1, "$db": "admin" },
        &lsid_of(lsid),
        1,
        false,
    )
}

fn code(reply: &Document) -> Option<i32> {
    reply.get_i32("code").ok()
}

fn labels(reply: &Document) -> Vec<&str> {
    reply
        .get_array("errorLabels")
        .map(|a| a.iter().filter_map(Bson::as_str).collect())
        .unwrap_or_default()
}

fn first_batch(reply: &Document) -> Vec<Document> {
    let cursor = reply.get_document("cursor").expect("a cursor reply");
    let batch = cursor.get_array("firstBatch").expect("a first batch");
    batch
        .iter()
        .filter_map(|d| d.as_document().cloned())
        .collect()
}

/// TK-2: a command no server knows is CommandNotFound (59); a real server's command the test
/// server does not run is TestkitUnsupported, after the fail point (the retryable-reads
/// mapReduce tests expect a failCommand naming it to fire); never a success, always logged.
#[tokio::test]
async fn unknown_commands_are_command_not_found() {
    bounded(async {
        let (server, mut client) = start().await;
        for name in ["frobnicate", "notACommand", "unsupportedCommand"] {
            let reply = client
                .command(doc! { name: "c", "$db": "db" })
                .await
                .unwrap();
            assert_eq!(code(&reply), Some(59), "{name}: {reply}");
            assert_eq!(reply.get_str("codeName").ok(), Some("CommandNotFound"));
        }
        for name in ["mapReduce", "collMod", "renameCollection"] {
            let reply = client
                .command(doc! { name: "c", "$db": "db" })
                .await
                .unwrap();
            assert_eq!(code(&reply), Some(TESTKIT_UNSUPPORTED), "{name}: {reply}");
        }
        assert_eq!(server.handle().unsupported().len(), 6);
        let fail = doc! { "failCommands": ["mapReduce"], "errorCode": 91 };
        let reply = client
            .command(fail_point(bson!({ "times": 1 }), fail))
            .await
            .unwrap();
        assert_eq!(code(&reply), None, "{reply}");
        let reply = client
            .command(doc! { "mapReduce": "c", "$db": "db" })
            .await
            .unwrap();
        assert_eq!(
            code(&reply),
            Some(91),
            "the fail point fires first: {reply}"
        );
        server.shutdown().await;
    })
    .await;
}

/// TK-2 (house rule 7): a real server looks a command up before anything reads its body (mongod:
/// `findCommand` before `execCommandDatabase`; a mongos: first in `_parseCommand`), so an unknown
/// command is CommandNotFound (59) whatever else it carries: not the session, transaction,
/// concern or `maxTimeMS` refusals, not a failCommand fail point naming it, not an
/// authentication refusal; the router's message on a mongos, the mongod's on a standalone; each
/// in the unsupported log.
#[tokio::test]
async fn tk2_an_unknown_command_is_59_before_every_other_check() {
    bounded(async {
        let (server, mut client) = start().await;
        let fail = doc! { "failCommands": ["frobnicate"], "errorCode": 91 };
        let reply = client
            .command(fail_point(Bson::from("alwaysOn"), fail))
            .await
            .unwrap();
        assert_eq!(code(&reply), None, "{reply}");
        let unknown = |extra: Document| {
            let mut body = doc! { "frobnicate": 1, "$db": "db" };
            body.extend(extra);
            body
        };
        let cases = [
            doc! {},
            doc! { "txnNumber": 1_i64 },
            doc! { "lsid": "not a document" },
            doc! { "lsid": lsid(), "txnNumber": 1_i32 },
            doc! { "readConcern": 5 },
            doc! { "readConcern": { "level": "bogus" } },
            doc! { "maxTimeMS": -1 },
            doc! { "lsid": lsid(), "txnNumber": 1_i64, "autocommit": true },
        ];
        for extra in cases {
            let body = unknown(extra);
            let reply = client.command(body.clone()).await.unwrap();
            assert_eq!(code(&reply), Some(59), "{body}: {reply}");
            assert_eq!(
                reply.get_str("errmsg").ok(),
                Some("no such cmd: frobnicate")
            );
        }
        assert_eq!(
            server.handle().unsupported().len(),
            8,
            "{:?}",
            server.handle().unsupported()
        );
        server.shutdown().await;

        let config = ServerConfig::new(retry_testkit::Role::Standalone).with_user("u", "p", &[]);
        let server = TestServer::start(config).await.expect("server starts");
        let mut client = RawClient::connect(server.address()).await.unwrap();
        let reply = client.command(unknown(doc! {})).await.unwrap();
        assert_eq!(code(&reply), Some(59), "unauthenticated: {reply}");
        assert_eq!(
            reply.get_str("errmsg").ok(),
            Some("no such command: 'frobnicate'")
        );
        let reply = client
            .command(doc! { "find": "c", "$db": "db" })
            .await
            .unwrap();
        assert_eq!(
            code(&reply),
            Some(13),
            "a known command needs authentication: {reply}"
        );
        server.shutdown().await;
    })
    .await;
}

/// Item 2 (house rule 7): `authenticate` (MONGODB-X509, AU-5) is in Stable API version 1 (the
/// server's IDL: `api_version: "1"`), so `apiStrict: true` does not refuse it and it needs no
/// authentication; the test server does not run it: TestkitUnsupported, logged (TK-2), never 59
/// or 323.
#[tokio::test]
async fn authenticate_is_in_api_version_1_and_unsupported_here() {
    bounded(async {
        let config = ServerConfig::new(retry_testkit::Role::Standalone).with_user("u", "p", &[]);
        let server = TestServer::start(config).await.expect("server starts");
        let mut client = RawClient::connect(server.address()).await.unwrap();
        let body = doc! { "authenticate": 1, "mechanism": "MONGODB-X509", "$db": "$external",
        "apiVersion": "1", "apiStrict": true };
        let reply = client.command(body).await.unwrap();
        assert_eq!(code(&reply), Some(TESTKIT_UNSUPPORTED), "{reply}");
        assert_eq!(
            server.handle().unsupported().len(),
            1,
            "{:?}",
            server.handle().unsupported()
        );
        server.shutdown().await;
    })
    .await;
}

/// TK-2 (leftovers11): `stmtId` is refused loudly (TestkitUnsupported, logged) before the
/// command does anything: a real server accepts it (a generic argument: a write's first
/// statement id) but no driver sends it, and the test server numbers statements by position.
/// The refused retryable write inserted nothing and took no `txnNumber`: the same write without
/// `stmtId` then runs as a first execution.
/// TK-2, review14 finding 2 (house rule 7): outside a transaction, `create`, `drop`,
/// `dropDatabase`, `createIndexes` and `dropIndexes` (`deleteIndexes`) support only the "local"
/// read concern level, as their `supportsReadConcern` is a server's default: any other level is
/// InvalidOptions (72) and the command does not run. "local" runs; the reads take "majority";
/// inside a transaction the starting statement's level is the transaction's.
#[tokio::test]
async fn tk2_ddl_commands_refuse_every_read_concern_level_but_local() {
    bounded(async {
        let (server, mut client) = start_primary().await;
        let with_level = |mut body: Document, level: &str| {
            body.insert("readConcern", doc! { "level": level });
            body
        };
        let seed = doc! { "insert": "c", "documents": [{ "_id": 1 }], "$db": "db" };
        assert_eq!(code(&client.command(seed).await.unwrap()), None);
        let index = doc! { "key": { "x": 1 }, "name": "x_1" };
        let commands = [
            doc! { "create": "made", "$db": "db" },
            doc! { "createIndexes": "c", "indexes": [index.clone()], "$db": "db" },
            doc! { "dropIndexes": "c", "index": "x_1", "$db": "db" },
            doc! { "deleteIndexes": "c", "index": "x_1", "$db": "db" },
            doc! { "drop": "c", "$db": "db" },
            doc! { "dropDatabase": 1, "$db": "db" },
        ];
        for command in &commands {
            let name = command.keys().next().unwrap().clone();
            for level in ["majority", "snapshot", "linearizable", "available"] {
                let reply = client
                    .command(with_level(command.clone(), level))
                    .await
                    .unwrap();
                assert_eq!(code(&reply), Some(72), "{name} {level}: {reply}");
                let message = reply.get_str("errmsg").unwrap();
                assert!(
                    message.starts_with(&format!("Command {name} does not support")),
                    "{message}"
                );
                assert!(message.ends_with("read concern not supported"), "{message}");
            }
        }
        // Nothing ran: no collection was made, `c` and its document are still there.
        let list = doc! { "listCollections": 1, "nameOnly": true, "$db": "db" };
        let batch = first_batch(&client.command(list).await.unwrap());
        let names: Vec<&str> = batch.iter().map(|c| c.get_str("name").unwrap()).collect();
        assert_eq!(names, ["c"]);
        for read in [
            doc! { "find": "c", "$db": "db" },
            doc! { "aggregate": "c", "pipeline": [], "cursor": {}, "$db": "db" },
            doc! { "count": "c", "$db": "db" },
            doc! { "distinct": "c", "key": "_id", "$db": "db" },
        ] {
            let reply = client.command(with_level(read, "majority")).await.unwrap();
            assert_eq!(code(&reply), None, "{reply}");
        }
        let find = doc! { "find": "c", "$db": "db" };
        assert_eq!(first_batch(&client.command(find).await.unwrap()).len(), 1);
        for command in [
            doc! { "createIndexes": "c", "indexes": [index.clone()], "$db": "db" },
            commands[0].clone(),
        ] {
            let reply = client.command(with_level(command, "local")).await.unwrap();
            assert_eq!(code(&reply), None, "{reply}");
        }
        // Leftovers12 item 1: in a transaction a mongod checks `create` and `createIndexes`
        // (only them) against the transaction's read concern, its first command's: "local"
        // only; the statement fails and the transaction is aborted.
        let in_transaction = |command: Document, level: Option<&str>, txn: i64, start: bool| {
            let command = match level {
                Some(level) => with_level(command, level),
                None => command,
            };
            in_transaction(command, &lsid(), txn, start)
        };
        let create = doc! { "create": "in_txn", "$db": "db" };
        let create_index =
            doc! { "createIndexes": "in_txn", "indexes": [index.clone()], "$db": "db" };
        for (txn, level) in [(1, "snapshot"), (2, "majority")] {
            let started = in_transaction(create.clone(), Some(level), txn, true);
            let reply = client.command(started).await.unwrap();
            assert_eq!(code(&reply), Some(72), "{level}: {reply}");
            assert_eq!(
                reply.get_str("errmsg").unwrap(),
                format!(
                    "Command create does not support this transaction's {{ readConcern: {{ \
                     level: \"{level}\", provenance: \"clientSupplied\" }} }} :: caused by :: \
                     read concern not supported"
                )
            );
        }
        // A later statement is checked against the first one's level.
        let find = doc! { "find": "c", "$db": "db" };
        let reply = client
            .command(in_transaction(find.clone(), Some("snapshot"), 3, true))
            .await
            .unwrap();
        assert_eq!(code(&reply), None, "{reply}");
        let reply = client
            .command(in_transaction(create_index.clone(), None, 3, false))
            .await
            .unwrap();
        assert_eq!(code(&reply), Some(72), "{reply}");
        let reply = client
            .command(in_transaction(find.clone(), None, 3, false))
            .await
            .unwrap();
        assert_eq!(
            code(&reply),
            Some(251),
            "aborted by the failed statement: {reply}"
        );
        // Other statements of a snapshot transaction are not checked; without a level, or
        // with "local", `create` runs.
        let insert = doc! { "insert": "c", "documents": [{ "_id": 2 }], "$db": "db" };
        let reply = client
            .command(in_transaction(insert, Some("snapshot"), 4, true))
            .await
            .unwrap();
        assert_eq!(code(&reply), None, "{reply}");
        for (txn, level) in [(5, Some("local")), (6, None)] {
            let name = format!("made_{txn}");
            let reply = client
                .command(in_transaction(
                    doc! { "create": name, "$db": "db" },
                    level,
                    txn,
                    true,
                ))
                .await
                .unwrap();
            assert_eq!(code(&reply), None, "{level:?}: {reply}");
        }
        server.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn tk2_stmt_id_is_refused_before_the_command_runs() {
    bounded(async {
        let (server, mut client) = start().await;
        let insert = |extra: Document| {
            let mut body = doc! { "insert": "s", "documents": [{ "_id": 1 }], "$db": "db",
            "lsid": lsid(), "txnNumber": 1_i64 };
            body.extend(extra);
            body
        };
        let reply = client.command(insert(doc! { "stmtId": 0 })).await.unwrap();
        assert_eq!(code(&reply), Some(TESTKIT_UNSUPPORTED), "{reply}");
        let reply = client
            .command(doc! { "ping": 1, "$db": "admin", "stmtId": 3 })
            .await
            .unwrap();
        assert_eq!(code(&reply), Some(TESTKIT_UNSUPPORTED), "{reply}");
        assert_eq!(server.handle().unsupported().len(), 2);
        assert!(server.handle().documents("db.s").is_empty());
        let reply = client.command(insert(doc! {})).await.unwrap();
        assert_eq!(
            (code(&reply), reply.get_i32("n").ok()),
            (None, Some(1)),
            "{reply}"
        );
        assert_eq!(server.handle().counters().command("insert").replayed, 0);
        server.shutdown().await;
    })
    .await;
}

/// Review9 finding 9 (house rule 7): `_id`s compare with canonical numbers at every depth, as on
/// a real server: `{_id: {a: 1}}` then `{_id: {a: 1.0}}` (or `NumberLong(1)`, or an array
/// holding them inside a document `_id`) is a duplicate key, E11000 (code 11000); keys in another
/// order are another id. (An array `_id` itself is InvalidIdField 53, review36 V6.)
#[tokio::test]
async fn review9_f9_nested_number_ids_are_duplicates() {
    bounded(async {
        let (server, mut client) = start().await;
        let mut insert = async |id: Bson| {
            let body = doc! { "insert": "n", "documents": [{ "_id": id }], "$db": "db" };
            client.command(body).await.unwrap()
        };
        let code = |reply: &Document| {
            let errors = reply.get_array("writeErrors").ok()?;
            errors[0].as_document()?.get_i32("code").ok()
        };
        let reply = insert(bson!({ "a": 1 })).await;
        assert_eq!((reply.get_i32("n").ok(), code(&reply)), (Some(1), None));
        for duplicate in [bson!({ "a": 1.0 }), bson!({ "a": 1_i64 })] {
            let reply = insert(duplicate).await;
            assert_eq!(code(&reply), Some(11000), "{reply}");
        }
        let reply = insert(bson!({ "l": [{ "a": 2 }, 3] })).await;
        assert_eq!(reply.get_i32("n").ok(), Some(1), "{reply}");
        let reply = insert(bson!({ "l": [{ "a": 2.0 }, 3_i64] })).await;
        assert_eq!(code(&reply), Some(11000), "{reply}");
        let reply = insert(bson!([{ "a": 2 }, 3])).await;
        assert_eq!(code(&reply), Some(53), "an array _id: {reply}");
        for id in [bson!({ "a": 1, "b": 1 }), bson!({ "b": 1, "a": 1 })] {
            let reply = insert(id).await;
            assert_eq!(reply.get_i32("n").ok(), Some(1), "another order: {reply}");
        }
        server.shutdown().await;
    })
    .await
}

/// TK-*: insert, update, delete, findAndModify, count, distinct, aggregate; unique `_id`
/// with error 11000 and `ordered` stopping at the first write error.
#[tokio::test]
async fn crud_commands() {
    bounded(async {
        let (server, mut client) = start().await;
        let mut run = async |body: Document| client.command(body).await.unwrap();
        let docs = vec![doc! { "_id": 1, "x": 11 }, doc! { "_id": 2, "x": 22 }];
        let reply = run(doc! { "insert": "c", "documents": docs, "$db": "db" }).await;
        assert_eq!(reply.get_i32("n").ok(), Some(2));

        let dups = vec![doc! { "_id": 3 }, doc! { "_id": 1 }, doc! { "_id": 4 }];
        let reply = run(doc! { "insert": "c", "documents": dups.clone(), "$db": "db" }).await;
        assert_eq!(reply.get_i32("n").ok(), Some(1), "ordered stops at _id 1");
        let error = reply.get_array("writeErrors").unwrap()[0]
            .as_document()
            .unwrap();
        assert_eq!(error.get_i32("index").ok(), Some(1));
        assert_eq!(error.get_i32("code").ok(), Some(11000));
        let reply =
            run(doc! { "insert": "c", "documents": dups, "ordered": false, "$db": "db" }).await;
        assert_eq!(
            reply.get_i32("n").ok(),
            Some(1),
            "unordered goes on to _id 4"
        );

        let reply = run(doc! { "count": "c", "query": { "_id": { "$gt": 1 } }, "$db": "db" }).await;
        assert_eq!(reply.get_i32("n").ok(), Some(3));
        let reply = run(doc! { "distinct": "c", "key": "x", "$db": "db" }).await;
        assert_eq!(reply.get_array("values").unwrap().len(), 2);

        let update = doc! {
            "update": "c",
            "updates": [
                { "q": { "_id": 1 }, "u": { "$inc": { "x": 1 } } },
                { "q": { "_id": 9 }, "u": { "$set": { "x": 9 } }, "upsert": true },
            ],
            "$db": "db",
        };
        let reply = run(update).await;
        assert_eq!(reply.get_i32("n").ok(), Some(2));
        assert_eq!(reply.get_i32("nModified").ok(), Some(1));
        assert_eq!(reply.get_array("upserted").unwrap().len(), 1);

        let fam = doc! { "findAndModify": "c", "query": { "_id": 2 },
        "update": { "$set": { "x": 0 } }, "new": true, "$db": "db" };
        let reply = run(fam).await;
        assert_eq!(
            reply.get_document("value").unwrap().get_i32("x").ok(),
            Some(0)
        );

        let delete = doc! { "delete": "c", "deletes": [{ "q": { "x": { "$gte": 9 } }, "limit": 0 }],
        "$db": "db" };
        assert_eq!(
            run(delete).await.get_i32("n").ok(),
            Some(2),
            "_id 1 (x 12) and 9"
        );

        let pipeline = vec![
            doc! { "$match": { "_id": { "$lte": 3 } } },
            doc! { "$project": { "x": 1 } },
            doc! { "$limit": 2 },
        ];
        let reply =
            run(doc! { "aggregate": "c", "pipeline": pipeline, "cursor": {}, "$db": "db" }).await;
        let batch = first_batch(&reply);
        assert_eq!(batch, vec![doc! { "_id": 2, "x": 0 }, doc! { "_id": 3 }]);

        let reply = run(doc! { "aggregate": "c", "pipeline": [{ "$unwind": "$x" }],
        "cursor": {}, "$db": "db" })
        .await;
        assert_eq!(
            code(&reply),
            Some(TESTKIT_UNSUPPORTED),
            "TK-2: an unsupported stage is refused loudly: {reply}"
        );
        let reply =
            run(doc! { "find": "c", "filter": { "x": { "$regex": "1" } }, "$db": "db" }).await;
        assert_eq!(
            code(&reply),
            Some(TESTKIT_UNSUPPORTED),
            "TK-2: an unsupported filter too"
        );
        server.shutdown().await;
    })
    .await;
}

/// Fixes18c (TK-15, house rule 7): a top-level `$comment` in a filter is no expression to a real
/// server (`expression_parser.cpp`), on every path that parses one: find's `filter`, count's
/// and distinct's `query`, an aggregate `$match`, an update's and a delete's `q` and
/// findAndModify's `query`; and `$exists` reads a non-boolean operand by its truthiness.
#[tokio::test]
async fn tk15_filters_ignore_a_top_level_comment_and_exists_reads_truthiness() {
    bounded(async {
        let (server, mut client) = start().await;
        let mut run = async |body: Document| client.command(body).await.unwrap();
        let docs = vec![doc! { "_id": 1, "x": 1 }, doc! { "_id": 2 }];
        run(doc! { "insert": "c", "documents": docs, "$db": "db" }).await;
        let filter = doc! { "$comment": "why", "x": { "$exists": "yes" } };

        let reply = run(doc! { "find": "c", "filter": filter.clone(), "$db": "db" }).await;
        assert_eq!(
            first_batch(&reply),
            vec![doc! { "_id": 1, "x": 1 }],
            "{reply}"
        );
        let reply = run(doc! { "count": "c", "query": filter.clone(), "$db": "db" }).await;
        assert_eq!(reply.get_i32("n").ok(), Some(1), "{reply}");
        let reply =
            run(doc! { "distinct": "c", "key": "_id", "query": filter.clone(), "$db": "db" }).await;
        assert_eq!(
            reply.get_array("values").ok(),
            Some(&vec![Bson::Int32(1)]),
            "{reply}"
        );
        let pipeline = vec![doc! { "$match": filter.clone() }];
        let reply =
            run(doc! { "aggregate": "c", "pipeline": pipeline, "cursor": {}, "$db": "db" }).await;
        assert_eq!(
            first_batch(&reply),
            vec![doc! { "_id": 1, "x": 1 }],
            "{reply}"
        );
        let fam = doc! { "findAndModify": "c", "query": filter.clone(),
        "update": { "$set": { "y": 1 } }, "$db": "db" };
        let reply = run(fam).await;
        assert_eq!(
            reply.get_document("value").ok(),
            Some(&doc! { "_id": 1, "x": 1 }),
            "{reply}"
        );
        let update = doc! { "update": "c", "updates": [{ "q": filter.clone(),
        "u": { "$set": { "z": 1 } }, "multi": true }], "$db": "db" };
        let reply = run(update).await;
        assert_eq!(reply.get_i32("n").ok(), Some(1), "{reply}");
        let delete = doc! { "delete": "c", "deletes": [{ "q": filter, "limit": 0 }], "$db": "db" };
        let reply = run(delete).await;
        assert_eq!(reply.get_i32("n").ok(), Some(1), "{reply}");
        let reply =
            run(doc! { "count": "c", "query": { "x": { "$exists": 0 } }, "$db": "db" }).await;
        assert_eq!(reply.get_i32("n").ok(), Some(1), "_id 2 is left: {reply}");
        server.shutdown().await;
    })
    .await;
}

/// TK-*: the default batch size is 101, and a cursor continues under its id.
#[tokio::test]
async fn default_batch_size_is_101() {
    bounded(async {
        let (server, mut client) = start().await;
        let docs: Vec<Document> = (0..150).map(|i| doc! { "_id": i }).collect();
        server.handle().insert("db.c", docs);
        let reply = client
            .command(doc! { "find": "c", "$db": "db" })
            .await
            .unwrap();
        assert_eq!(first_batch(&reply).len(), 101);
        let id = reply.get_document("cursor").unwrap().get_i64("id").unwrap();
        let more = doc! { "getMore": id, "collection": "c", "$db": "db" };
        let reply = client.command(more).await.unwrap();
        let cursor = reply.get_document("cursor").unwrap();
        assert_eq!(cursor.get_array("nextBatch").unwrap().len(), 49);
        assert_eq!(cursor.get_i64("id").ok(), Some(0));
        server.shutdown().await;
    })
    .await;
}

/// TK-*: collections, databases and indexes can be created, listed and dropped; a change
/// stream opens a cursor that stays open.
#[tokio::test]
async fn catalog_commands_and_change_streams() {
    bounded(async {
        let (server, mut client) = start().await;
        let mut run = async |body: Document| client.command(body).await.unwrap();
        assert_eq!(code(&run(doc! { "create": "a", "$db": "db" }).await), None);
        assert_eq!(
            code(&run(doc! { "create": "a", "$db": "db" }).await),
            Some(48)
        );
        let reply = run(doc! { "createIndexes": "b", "indexes": [], "$db": "db" }).await;
        assert_eq!(code(&reply), Some(2), "no index to create");
        let index = doc! { "key": { "x": 1 }, "name": "x_1" };
        let reply = run(doc! { "createIndexes": "b", "indexes": [index], "$db": "db" }).await;
        assert_eq!(code(&reply), None);
        let reply =
            run(doc! { "listIndexes": "b", "cursor": { "batchSize": 1 }, "$db": "db" }).await;
        assert_eq!(first_batch(&reply).len(), 1, "TK-3: cursor.batchSize");
        let reply = run(doc! { "dropIndexes": "b", "index": "x_1", "$db": "db" }).await;
        assert_eq!(code(&reply), None);
        let reply = run(doc! { "dropIndexes": "b", "index": "x_1", "$db": "db" }).await;
        assert_eq!(code(&reply), Some(27), "IndexNotFound");
        let reply = run(doc! { "find": "b", "filter": { "$or": true }, "$db": "db" }).await;
        assert_eq!(
            code(&reply),
            Some(2),
            "BadValue even on an empty collection"
        );
        let reply = run(doc! { "listCollections": 1, "$db": "db" }).await;
        let names: Vec<String> = first_batch(&reply)
            .iter()
            .map(|d| d.get_str("name").unwrap().to_owned())
            .collect();
        assert_eq!(names, ["a", "b"]);
        let reply = run(doc! { "listDatabases": 1, "$db": "admin" }).await;
        assert_eq!(reply.get_array("databases").unwrap().len(), 1);
        let reply = run(doc! { "listIndexes": "a", "$db": "db" }).await;
        assert_eq!(first_batch(&reply)[0].get_str("name").ok(), Some("_id_"));
        assert_eq!(code(&run(doc! { "drop": "a", "$db": "db" }).await), None);
        assert_eq!(
            code(&run(doc! { "drop": "a", "$db": "db" }).await),
            Some(26)
        );

        let reply = run(
            doc! { "aggregate": "b", "pipeline": [{ "$changeStream": {} }],
            "cursor": {}, "$db": "db" },
        )
        .await;
        let id = reply.get_document("cursor").unwrap().get_i64("id").unwrap();
        assert_ne!(id, 0);
        let reply = run(doc! { "getMore": id, "collection": "b", "$db": "db" }).await;
        assert_eq!(
            reply.get_document("cursor").unwrap().get_i64("id").ok(),
            Some(id)
        );
        server.shutdown().await;
    })
    .await;
}

/// TK-*: a retried write with the same lsid and txnNumber runs once and gets the first reply,
/// for update and delete as for insert.
#[tokio::test]
async fn retryable_writes_are_deduplicated_for_every_write_type() {
    bounded(async {
        let (server, mut client) = start_primary().await;
        server.handle().insert("db.c", vec![doc! { "_id": 1, "x": 0 }, doc! { "_id": 2 }]);
        let lsid = doc! { "id": Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![7; 16] }) };
        let inc = doc! { "update": "c", "updates": [{ "q": { "_id": 1 }, "u": { "$inc": { "x": 1 } } }],
                         "lsid": lsid.clone(), "txnNumber": 1_i64, "$db": "db" };
        for _ in 0..2 {
            let reply = client.command(inc.clone()).await.unwrap();
            assert_eq!(reply.get_i32("nModified").ok(), Some(1));
        }
        let delete = doc! { "delete": "c", "deletes": [{ "q": {}, "limit": 1 }],
                            "lsid": lsid.clone(), "txnNumber": 2_i64, "$db": "db" };
        for _ in 0..2 {
            assert_eq!(client.command(delete.clone()).await.unwrap().get_i32("n").ok(), Some(1));
        }
        let docs = server.handle().documents("db.c");
        assert_eq!(docs, vec![doc! { "_id": 2 }], "the update ran once, the delete once");
        let old = doc! { "insert": "c", "documents": [{ "_id": 5 }], "lsid": lsid.clone(),
                         "txnNumber": 0_i64, "$db": "db" };
        let reply = client.command(old).await.unwrap();
        assert_eq!(code(&reply), Some(225), "TK-6: TransactionTooOld: {reply}");
        server.shutdown().await;
    })
    .await;
}

fn fail_point(mode: Bson, data: Document) -> Document {
    doc! { "configureFailPoint": "failCommand", "mode": mode, "data": data, "$db": "admin" }
}

/// TK-9: `skip` lets n commands through then fires on every one; `activationProbability`
/// fires on a deterministic share; a bad mode is refused.
#[tokio::test]
async fn fail_point_modes_skip_and_probability() {
    bounded(async {
        let (server, mut client) = start().await;
        let data = doc! { "failCommands": ["ping"], "errorCode": 91 };
        let reply = client
            .command(fail_point(doc! { "skip": 2 }.into(), data.clone()))
            .await
            .unwrap();
        assert_eq!(code(&reply), None, "{reply}");
        let mut codes = Vec::new();
        for _ in 0..4 {
            codes.push(code(
                &client
                    .command(doc! { "ping": 1, "$db": "admin" })
                    .await
                    .unwrap(),
            ));
        }
        assert_eq!(codes, [None, None, Some(91), Some(91)]);

        let mode = doc! { "activationProbability": 0.5 };
        client
            .command(fail_point(mode.into(), data.clone()))
            .await
            .unwrap();
        let mut fired = 0;
        for _ in 0..200 {
            let reply = client
                .command(doc! { "ping": 1, "$db": "admin" })
                .await
                .unwrap();
            fired += usize::from(code(&reply) == Some(91));
        }
        assert!(
            (60..140).contains(&fired),
            "about half of 200 fired: {fired}"
        );

        let unknown = doc! { "failCommands": ["ping"], "errorCodes": 1 };
        let reply = client
            .command(fail_point("alwaysOn".into(), unknown))
            .await
            .unwrap();
        assert_eq!(
            code(&reply),
            Some(2),
            "TK-10: an unknown data field is refused"
        );
        for bad in [
            doc! { "skip": -1 },
            doc! { "activationProbability": 2.0 },
            doc! { "often": 1 },
        ] {
            let reply = client
                .command(fail_point(bad.into(), data.clone()))
                .await
                .unwrap();
            assert_eq!(code(&reply), Some(2), "{reply}");
        }
        server.shutdown().await;
    })
    .await;
}

/// TK-8, RW-9: a writeConcernError fail point adds its errorLabels, or RetryableWriteError for a
/// retryable write with a retryable code, as an 8.x server does.
#[tokio::test]
async fn write_concern_error_carries_labels() {
    bounded(async {
        let (server, mut client) = start_primary().await;
        let data = doc! { "failCommands": ["insert"],
        "writeConcernError": { "code": 91, "errmsg": "shutting down" } };
        client
            .command(fail_point(doc! { "times": 2 }.into(), data))
            .await
            .unwrap();
        let lsid = lsid();
        let insert = doc! { "insert": "c", "documents": [{ "_id": 1 }], "lsid": lsid,
        "txnNumber": 1_i64, "$db": "db" };
        let reply = client.command(insert).await.unwrap();
        assert_eq!(
            reply
                .get_document("writeConcernError")
                .unwrap()
                .get_i32("code")
                .ok(),
            Some(91)
        );
        assert_eq!(labels(&reply), ["RetryableWriteError"]);
        let plain = doc! { "insert": "c", "documents": [{ "_id": 2 }], "$db": "db" };
        let reply = client.command(plain).await.unwrap();
        assert!(reply.contains_key("writeConcernError"));
        assert!(labels(&reply).is_empty(), "not a retryable write: {reply}");
        server.shutdown().await;
    })
    .await;
}

/// TK-*: several mongos (and a replica set's members) share one data store, so a write through
/// one is read through another, and a retried write on another router is not run twice.
#[tokio::test]
async fn mongoses_share_one_data_store() {
    bounded(async {
        let (servers, mut first, mut second) = start_two_mongoses().await;
        let insert = doc! { "insert": "c", "documents": [{ "_id": 1 }], "lsid": lsid(),
        "txnNumber": 1_i64, "$db": "db" };
        assert_eq!(
            first
                .command(insert.clone())
                .await
                .unwrap()
                .get_i32("n")
                .ok(),
            Some(1)
        );
        let retry = second.command(insert).await.unwrap();
        assert_eq!(
            retry.get_i32("n").ok(),
            Some(1),
            "the retry gets the first reply"
        );
        assert!(
            !retry.contains_key("writeErrors"),
            "and is not run again: {retry}"
        );
        let reply = second
            .command(doc! { "count": "c", "$db": "db" })
            .await
            .unwrap();
        assert_eq!(reply.get_i32("n").ok(), Some(1));
        for server in servers {
            server.shutdown().await;
        }

        let members = TestServer::start_replica_set("rs0", 2, ServerConfig::default())
            .await
            .expect("replica set starts");
        members[0].handle().insert("db.c", vec![doc! { "_id": 1 }]);
        assert_eq!(members[1].handle().documents("db.c").len(), 1);
        for member in members {
            member.shutdown().await;
        }
    })
    .await;
}

/// TK-11: `onPrimaryTransactionalWrite` commits then closes (default), or closes without
/// committing with `failBeforeCommitExceptionCode`; a deduplicated retry never fires it; a mongos
/// refuses it.
#[tokio::test]
async fn on_primary_transactional_write() {
    bounded(async {
        let (primary, mut client) = start_primary().await;
        let address = primary.address();
        let handle = primary.handle();
        let set = |mode: Bson, data: Document| {
            doc! { "configureFailPoint": "onPrimaryTransactionalWrite", "mode": mode,
            "data": data, "$db": "admin" }
        };
        let insert = |id: i32, txn: i64| {
            doc! { "insert": "c", "documents": [{ "_id": id }], "lsid": lsid(),
            "txnNumber": txn, "$db": "db" }
        };
        let reply = client
            .command(set("alwaysOn".into(), doc! {}))
            .await
            .unwrap();
        assert_eq!(code(&reply), None, "{reply}");
        assert!(
            client.command(insert(1, 1)).await.is_err(),
            "closed after the commit"
        );
        assert_eq!(handle.documents("db.c").len(), 1, "committed");
        let mut client = RawClient::connect(address).await.unwrap();
        let retry = client.command(insert(1, 1)).await.unwrap();
        assert_eq!(
            retry.get_i32("n").ok(),
            Some(1),
            "a replayed retry does not fire: {retry}"
        );

        let data = doc! { "failBeforeCommitExceptionCode": 1 };
        client
            .command(set(doc! { "times": 1 }.into(), data))
            .await
            .unwrap();
        assert!(client.command(insert(2, 2)).await.is_err(), "closed");
        assert_eq!(handle.documents("db.c").len(), 1, "not committed");
        let mut client = RawClient::connect(address).await.unwrap();
        let retry = client.command(insert(2, 2)).await.unwrap();
        assert_eq!(
            retry.get_i32("n").ok(),
            Some(1),
            "the retry commits: {retry}"
        );
        assert_eq!(handle.documents("db.c").len(), 2);
        primary.shutdown().await;

        let mongos = TestServer::start_mongoses(1, ServerConfig::default())
            .await
            .unwrap();
        let mut client = RawClient::connect(mongos[0].address()).await.unwrap();
        let reply = client
            .command(set("alwaysOn".into(), doc! {}))
            .await
            .unwrap();
        assert_eq!(
            code(&reply),
            Some(2),
            "mongos has no such fail point: {reply}"
        );
        for server in mongos {
            server.shutdown().await;
        }
    })
    .await;
}

/// TK-12: a cursor stays with the mongos that opened it; a getMore through another is 43.
#[tokio::test]
async fn a_cursor_stays_with_its_mongos() {
    bounded(async {
        let servers = TestServer::start_mongoses(2, ServerConfig::default())
            .await
            .expect("mongoses start");
        servers[0]
            .handle()
            .insert("db.c", (0..3).map(|i| doc! { "_id": i }).collect());
        let mut first = RawClient::connect(servers[0].address()).await.unwrap();
        let mut second = RawClient::connect(servers[1].address()).await.unwrap();
        let find = doc! { "find": "c", "batchSize": 1, "$db": "db" };
        let reply = first.command(find).await.unwrap();
        let id = reply.get_document("cursor").unwrap().get_i64("id").unwrap();
        let more = doc! { "getMore": id, "collection": "c", "$db": "db" };
        assert_eq!(code(&second.command(more.clone()).await.unwrap()), Some(43));
        assert_eq!(code(&first.command(more).await.unwrap()), None);
        for server in servers {
            server.shutdown().await;
        }
    })
    .await;
}

/// TK-14: find's sort, skip, limit and projection, aggregate's $sort; an unknown find option is
/// TestkitUnsupported, never ignored (TK-2).
#[tokio::test]
async fn find_options_and_sort() {
    bounded(async {
        let (server, mut client) = start().await;
        let docs = vec![
            doc! { "_id": 2, "x": "b" },
            doc! { "_id": 1, "x": "a" },
            doc! { "_id": 3 },
        ];
        server.handle().insert("db.c", docs);
        let find = doc! { "find": "c", "sort": { "_id": -1 }, "skip": 1, "limit": 1,
        "projection": { "_id": 0 }, "$db": "db" };
        let reply = client.command(find).await.unwrap();
        assert_eq!(first_batch(&reply), vec![doc! { "x": "b" }]);
        let pipeline = vec![doc! { "$sort": { "x": 1 } }];
        let reply = client
            .command(doc! { "aggregate": "c", "pipeline": pipeline, "cursor": {}, "$db": "db" })
            .await
            .unwrap();
        let ids: Vec<i32> = first_batch(&reply)
            .iter()
            .map(|d| d.get_i32("_id").unwrap())
            .collect();
        assert_eq!(ids, [3, 1, 2], "a missing field sorts first");
        let reply = client
            .command(doc! { "find": "c", "hint": "_id_", "$db": "db" })
            .await
            .unwrap();
        assert_eq!(code(&reply), Some(TESTKIT_UNSUPPORTED), "{reply}");
        server.shutdown().await;
    })
    .await;
}

/// TK-14: `$group` with a constant `_id` and `$sum`, `$out`, `$merge {into}`, and
/// `$listLocalSessions` on a collectionless aggregate; other forms are refused (TK-2) and logged
/// (TK-16).
#[tokio::test]
async fn aggregate_group_out_merge_and_local_sessions() {
    bounded(async {
        let (server, mut client) = start().await;
        let handle = server.handle();
        handle.insert("db.c", vec![doc! { "_id": 1, "x": 1 }, doc! { "_id": 2, "x": 2 }]);
        let count = doc! { "$group": { "_id": 1, "n": { "$sum": 1 } } };
        let reply = client
            .command(doc! { "aggregate": "c", "pipeline": [count.clone()], "cursor": {}, "$db": "db" })
            .await
            .unwrap();
        assert_eq!(first_batch(&reply), vec![doc! { "_id": 1, "n": 2 }]);
        let empty = client
            .command(doc! { "aggregate": "none", "pipeline": [count], "cursor": {}, "$db": "db" })
            .await
            .unwrap();
        assert!(first_batch(&empty).is_empty(), "no input, no group");
        let out = client
            .command(doc! { "aggregate": "c", "pipeline": [{ "$out": "o" }], "cursor": {}, "$db": "db" })
            .await
            .unwrap();
        assert!(first_batch(&out).is_empty());
        assert_eq!(handle.documents("db.o").len(), 2);
        handle.insert("db.m", vec![doc! { "_id": 1, "y": 1 }]);
        client
            .command(doc! { "aggregate": "c", "pipeline": [{ "$merge": { "into": "m" } }], "cursor": {}, "$db": "db" })
            .await
            .unwrap();
        assert_eq!(
            handle.documents("db.m"),
            vec![doc! { "_id": 1, "y": 1, "x": 1 }, doc! { "_id": 2, "x": 2 }]
        );
        // Leftovers12 item 4: a real `$merge` is an unordered batch of `$set` upserts, and a
        // `$set` of `_id` to the same number of another type is ImmutableField 66 (the server's
        // `modifier_node.cpp`): `{_id: 5000.0}` onto `{_id: 5000}` fails, the other document is
        // written, the existing one stays as it was.
        handle.insert("db.src", vec![doc! { "_id": 5000.0, "z": 1 }, doc! { "_id": 9, "z": 2 }]);
        handle.insert("db.dst", vec![doc! { "_id": 5000 }]);
        let reply = client
            .command(doc! { "aggregate": "src", "pipeline": [{ "$merge": { "into": "dst" } }], "cursor": {}, "$db": "db" })
            .await
            .unwrap();
        assert_eq!(code(&reply), Some(66), "{reply}");
        assert_eq!(
            handle.documents("db.dst"),
            vec![doc! { "_id": 5000 }, doc! { "_id": 9, "z": 2 }]
        );
        let lsid = lsid_of(7);
        client
            .command(doc! { "ping": 1, "lsid": lsid.clone(), "$db": "db" })
            .await
            .unwrap();
        let sessions = client
            .command(doc! { "aggregate": 1, "pipeline": [{ "$listLocalSessions": {} }], "cursor": {}, "$db": "db" })
            .await
            .unwrap();
        assert_eq!(first_batch(&sessions), vec![doc! { "_id": lsid }]);
        assert!(handle.unsupported().is_empty());
        let refused = client
            .command(doc! { "aggregate": "c", "pipeline": [{ "$group": { "_id": "$x" } }], "cursor": {}, "$db": "db" })
            .await
            .unwrap();
        assert_eq!(code(&refused), Some(TESTKIT_UNSUPPORTED));
        assert_eq!(handle.unsupported().len(), 1, "{:?}", handle.unsupported());
        server.shutdown().await;
    })
    .await;
}

/// TK-2 (review12 finding 2): over the wire, a `$out` whose documents share an `_id` fails with
/// DuplicateKey 11000 as a real one does, its target unchanged; a `$out` of documents without
/// `_id` stores each with an ObjectId `_id`, as an insert does.
#[tokio::test]
async fn tk2_out_admits_documents_as_an_insert_does() {
    bounded(async {
        let (server, mut client) = start().await;
        let handle = server.handle();
        handle.insert("db.c", vec![doc! { "_id": 1, "x": 1 }, doc! { "_id": 2, "x": 2 }]);
        handle.insert("db.o", vec![doc! { "_id": 9 }]);
        let duplicate = client
            .command(doc! {
                "aggregate": "c", "pipeline": [{ "$addFields": { "_id": 1 } }, { "$out": "o" }],
                "cursor": {}, "$db": "db",
            })
            .await
            .unwrap();
        assert_eq!(code(&duplicate), Some(11000), "{duplicate}");
        assert_eq!(handle.documents("db.o"), [doc! { "_id": 9 }], "unchanged");
        let out = client
            .command(doc! {
                "aggregate": "c", "pipeline": [{ "$project": { "_id": 0, "x": 1 } }, { "$out": "o" }],
                "cursor": {}, "$db": "db",
            })
            .await
            .unwrap();
        assert_eq!(out.get_f64("ok").ok(), Some(1.0), "{out}");
        let stored = handle.documents("db.o");
        assert_eq!(stored.len(), 2, "{stored:?}");
        for document in &stored {
            assert!(document.get_object_id("_id").is_ok(), "{document}");
        }
        assert!(handle.unsupported().is_empty(), "{:?}", handle.unsupported());
        server.shutdown().await;
    })
    .await;
}

/// TK-14: findAndModify with `sort` modifies the first matching document in that order.
#[tokio::test]
async fn find_and_modify_sort() {
    bounded(async {
        let (server, mut client) = start().await;
        let handle = server.handle();
        handle.insert(
            "db.c",
            vec![doc! { "_id": 1, "x": 1 }, doc! { "_id": 2, "x": 1 }],
        );
        let reply = client
            .command(doc! {
                "findAndModify": "c", "query": { "x": 1 }, "sort": { "_id": -1 }, "remove": true,
                "$db": "db",
            })
            .await
            .unwrap();
        assert_eq!(
            reply.get_document("value").unwrap(),
            &doc! { "_id": 2, "x": 1 }
        );
        assert_eq!(handle.documents("db.c"), vec![doc! { "_id": 1, "x": 1 }]);
        server.shutdown().await;
    })
    .await;
}

/// TK-14: the 8.0 admin `bulkWrite`: per-op results and counts, only errors with `errorsOnly`,
/// an ordered bulk stops at its first error, other databases are refused.
#[tokio::test]
async fn client_bulk_write() {
    bounded(async {
        let (server, mut client) = start().await;
        let handle = server.handle();
        handle.insert("db.c", vec![doc! { "_id": 1, "x": 1 }]);
        let ops = vec![
            doc! { "insert": 0, "document": { "_id": 2 } },
            doc! { "update": 0, "filter": { "_id": 1 }, "updateMods": { "$set": { "x": 2 } }, "multi": false },
            doc! { "insert": 0, "document": { "_id": 1 } },
            doc! { "delete": 0, "filter": { "_id": 2 }, "multi": false },
        ];
        let command = doc! {
            "bulkWrite": 1, "ops": ops, "nsInfo": [{ "ns": "db.c" }], "errorsOnly": false,
            "ordered": true, "$db": "admin",
        };
        let reply = client.command(command.clone()).await.unwrap();
        let results = first_batch(&reply);
        assert_eq!(results.len(), 3, "stopped at the duplicate: {reply}");
        assert_eq!(results[2].get_i32("code").ok(), Some(11000));
        assert_eq!(
            (reply.get_i32("nInserted").ok(), reply.get_i32("nModified").ok(), reply.get_i32("nErrors").ok()),
            (Some(1), Some(1), Some(1))
        );
        let mut errors_only = command.clone();
        errors_only.insert("errorsOnly", true);
        errors_only.insert("ordered", false);
        handle.insert("db.c", vec![doc! { "_id": 3 }]);
        let reply = client.command(errors_only).await.unwrap();
        assert_eq!(first_batch(&reply).len(), 2, "two duplicates, nothing else: {reply}");
        assert_eq!(reply.get_i32("nDeleted").ok(), Some(1));
        let mut elsewhere = command;
        elsewhere.insert("$db", "db");
        assert_eq!(code(&client.command(elsewhere).await.unwrap()), Some(13));
        server.shutdown().await;
    })
    .await;
}

/// TK-15: a transaction starts with its first command, its writes are invisible to others
/// until it commits, it commits idempotently, aborts by undoing its own changes; a command of no transaction in progress is NoSuchTransaction (251) with
/// TransientTransactionError (TK-7); a mongos adds a recovery token.
#[tokio::test]
async fn transactions() {
    bounded(async {
        let server = TestServer::start(ServerConfig::new(retry_testkit::Role::Mongos))
            .await
            .unwrap();
        let mut client = RawClient::connect(server.address()).await.unwrap();
        let handle = server.handle();
        let lsid = lsid_of(1);
        let insert = |txn: i64, start: bool, id: i32| {
            let insert = doc! { "insert": "c", "documents": [{ "_id": id }], "$db": "db" };
            in_transaction(insert, &lsid, txn, start)
        };
        let end = |name: &str, txn: i64| {
            doc! { name: 1, "lsid": lsid.clone(), "txnNumber": txn, "autocommit": false, "$db": "admin" }
        };
        let reply = client.command(insert(1, true, 1)).await.unwrap();
        assert_eq!(reply.get_i32("n").ok(), Some(1), "{reply}");
        assert!(reply.contains_key("recoveryToken"));
        for _ in 0..2 {
            let reply = client.command(end("commitTransaction", 1)).await.unwrap();
            assert_eq!(code(&reply), None, "commit is idempotent: {reply}");
        }
        let reply = client.command(insert(1, false, 2)).await.unwrap();
        assert_eq!(code(&reply), Some(251));
        assert_eq!(labels(&reply), ["TransientTransactionError"]);
        client.command(insert(2, true, 2)).await.unwrap();
        assert_eq!(
            handle.documents("db.c"),
            vec![doc! { "_id": 1 }],
            "TK-15: invisible until the commit"
        );
        let reply = client.command(end("abortTransaction", 2)).await.unwrap();
        assert_eq!(code(&reply), None, "{reply}");
        assert_eq!(handle.documents("db.c"), vec![doc! { "_id": 1 }], "the abort undid it");
        let reply = client.command(end("commitTransaction", 2)).await.unwrap();
        assert_eq!(code(&reply), Some(251), "an aborted transaction cannot commit");
        let reply = client.command(insert(1, true, 3)).await.unwrap();
        assert_eq!(code(&reply), Some(225), "TransactionTooOld: {reply}");
        assert!(handle.unsupported().is_empty());
        server.shutdown().await;
    })
    .await;
}

/// TK-15: a collection a transaction creates (by its first insert, or by `create`) is invisible
/// outside the transaction until it commits, and gone again when the transaction aborts, as on a
/// real server; one a committed transaction created stays.
#[tokio::test]
async fn tk15_collections_a_transaction_creates_are_hidden_until_commit_and_dropped_by_abort() {
    bounded(async {
        let (server, mut client) = start_primary().await;
        let lsid = lsid_of(3);
        let in_transaction =
            |command: Document, txn: i64, start: bool| in_transaction(command, &lsid, txn, start);
        let collections = |reply: &Document| -> Vec<String> {
            first_batch(reply)
                .iter()
                .filter_map(|c| c.get_str("name").ok().map(str::to_owned))
                .collect()
        };
        let list = doc! { "listCollections": 1, "nameOnly": true, "$db": "db" };
        let insert = doc! { "insert": "fresh", "documents": [{ "_id": 1 }], "$db": "db" };
        let create = doc! { "create": "made", "$db": "db" };
        for (txn, end, kept) in [
            (1, "abortTransaction", false),
            (2, "commitTransaction", true),
        ] {
            let reply = client
                .command(in_transaction(insert.clone(), txn, true))
                .await
                .unwrap();
            assert_eq!(code(&reply), None, "{reply}");
            let reply = client
                .command(in_transaction(create.clone(), txn, false))
                .await
                .unwrap();
            assert_eq!(code(&reply), None, "{reply}");
            let unseen = collections(&client.command(list.clone()).await.unwrap());
            assert!(
                unseen.is_empty(),
                "invisible outside until the commit: {unseen:?}"
            );
            let ended = in_transaction(doc! { end: 1, "$db": "admin" }, txn, false);
            assert_eq!(code(&client.command(ended).await.unwrap()), None);
            let names = collections(&client.command(list.clone()).await.unwrap());
            let expected: Vec<String> = if kept {
                vec!["fresh".into(), "made".into()]
            } else {
                Vec::new()
            };
            assert_eq!(names, expected, "after {end}");
        }
        server.shutdown().await;
    })
    .await;
}

/// TK-12, TK-15, TX-3 (transactions spec "Mongos Pinning", "recoveryToken field"; the
/// `pin-mongos` and `mongos-recovery-token` suites): the transaction's data lives on the
/// shards, which every mongos shares, but each mongos keeps its own router state: a statement
/// sent to a mongos that did not start the transaction is NoSuchTransaction (251) with
/// TransientTransactionError, and so is an abort there or a commit of a transaction not yet
/// committed (no decision to recover); a commit of a committed one succeeds there with the
/// `recoveryToken` and is refused with 50940 without it, as a real mongos does (review8 finding
/// 2, TX-6). The mongos that started it goes on as before.
#[tokio::test]
async fn tk12_only_the_mongos_that_started_a_transaction_continues_it() {
    bounded(async {
        let (servers, mut first, mut other) = start_two_mongoses().await;
        let lsid = lsid_of(4);
        let command =
            |body: Document, txn: i64, start: bool| in_transaction(body, &lsid, txn, start);
        let insert = |id: i32| doc! { "insert": "c", "documents": [{ "_id": id }], "$db": "db" };
        let commit = doc! { "commitTransaction": 1, "$db": "admin" };
        let abort = doc! { "abortTransaction": 1, "$db": "admin" };
        let reply = first.command(command(insert(1), 1, true)).await.unwrap();
        assert_eq!(code(&reply), None, "{reply}");
        let token = reply.get_document("recoveryToken").unwrap().clone();
        let with_token = |mut body: Document| {
            body.insert("recoveryToken", token.clone());
            body
        };
        let reply = other.command(command(insert(2), 1, false)).await.unwrap();
        assert_eq!(code(&reply), Some(251), "{reply}");
        assert_eq!(labels(&reply), ["TransientTransactionError"]);
        let reply = other
            .command(command(with_token(commit.clone()), 1, false))
            .await
            .unwrap();
        assert_eq!(code(&reply), Some(251), "no decision to recover: {reply}");
        let reply = other
            .command(command(commit.clone(), 1, false))
            .await
            .unwrap();
        assert_eq!(code(&reply), Some(50940), "no recoveryToken: {reply}");
        let reply = other
            .command(command(abort.clone(), 1, false))
            .await
            .unwrap();
        assert_eq!(code(&reply), Some(251), "{reply}");
        let reply = first.command(command(insert(3), 1, false)).await.unwrap();
        assert_eq!(code(&reply), None, "the first mongos goes on: {reply}");
        let reply = first
            .command(command(commit.clone(), 1, false))
            .await
            .unwrap();
        assert_eq!(code(&reply), None, "{reply}");
        let reply = other
            .command(command(commit.clone(), 1, false))
            .await
            .unwrap();
        assert_eq!(code(&reply), Some(50940), "no recoveryToken: {reply}");
        let reply = other
            .command(command(with_token(commit), 1, false))
            .await
            .unwrap();
        assert_eq!(code(&reply), None, "the decision is recovered: {reply}");
        let ids: Vec<Bson> = servers[0]
            .handle()
            .documents("db.c")
            .iter()
            .filter_map(|d| d.get("_id").cloned())
            .collect();
        assert_eq!(ids, [Bson::Int32(1), Bson::Int32(3)]);
        for server in servers {
            server.shutdown().await;
        }
    })
    .await;
}

/// TK-12: a load balancer in front of two mongos routes new connections round robin; each
/// connection's hello reports its mongos' `serviceId`.
#[tokio::test]
async fn load_balancer_in_front_of_two_mongos() {
    bounded(async {
        let role = retry_testkit::Role::LoadBalancer { service_id: true };
        let server = TestServer::start(ServerConfig::new(role)).await.unwrap();
        server.handle().set_load_balanced_services(2);
        let mut ids = Vec::new();
        for _ in 0..4 {
            let mut client = RawClient::connect(server.address()).await.unwrap();
            let hello = client
                .command(doc! { "hello": 1, "loadBalanced": true, "$db": "admin" })
                .await
                .unwrap();
            ids.push(hello.get_object_id("serviceId").unwrap());
        }
        assert_ne!(ids[0], ids[1]);
        assert_eq!((ids[0], ids[1]), (ids[2], ids[3]), "round robin");
        assert!(ids.contains(&server.handle().process_id()));
        server.shutdown().await;
    })
    .await;
}

/// TK-12: the mongoses behind a load balancer are mongoses: a cursor stays with the one that
/// opened it (a getMore through the other is CursorNotFound 43) and a transaction with the one
/// that started it (a statement through the other is NoSuchTransaction 251), while the data is
/// shared.
#[tokio::test]
async fn tk12_each_mongos_behind_a_load_balancer_keeps_its_cursors_and_transactions() {
    bounded(async {
        let role = retry_testkit::Role::LoadBalancer { service_id: true };
        let server = TestServer::start(ServerConfig::new(role)).await.unwrap();
        server.handle().set_load_balanced_services(2);
        let mut clients = Vec::new();
        for _ in 0..2 {
            let mut client = RawClient::connect(server.address()).await.unwrap();
            let hello = doc! { "hello": 1, "loadBalanced": true, "$db": "admin" };
            client.command(hello).await.unwrap();
            clients.push(client);
        }
        let [mut first, mut other] = <[RawClient; 2]>::try_from(clients).ok().unwrap();
        let insert = doc! { "insert": "c", "documents": [{ "_id": 1 }, { "_id": 2 }], "$db": "db" };
        assert_eq!(code(&first.command(insert).await.unwrap()), None);
        let find = doc! { "find": "c", "batchSize": 1, "$db": "db" };
        let reply = first.command(find).await.unwrap();
        let id = reply.get_document("cursor").unwrap().get_i64("id").unwrap();
        let more = doc! { "getMore": id, "collection": "c", "$db": "db" };
        assert_eq!(code(&other.command(more.clone()).await.unwrap()), Some(43));
        assert_eq!(code(&first.command(more).await.unwrap()), None);
        let lsid = lsid_of(6);
        let statement = |id: i32, start: bool| {
            let insert = doc! { "insert": "c", "documents": [{ "_id": id }], "$db": "db" };
            in_transaction(insert, &lsid, 1, start)
        };
        assert_eq!(
            code(&first.command(statement(3, true)).await.unwrap()),
            None
        );
        let reply = other.command(statement(4, false)).await.unwrap();
        assert_eq!(code(&reply), Some(251), "{reply}");
        assert_eq!(
            code(&first.command(statement(5, false)).await.unwrap()),
            None
        );
        server.shutdown().await;
    })
    .await;
}

/// TK-2: fields a real server acts on but the test server does not evaluate are refused and
/// logged, never ignored: a command's own fields and an update or delete statement's.
#[tokio::test]
async fn unknown_fields_are_refused() {
    bounded(async {
        let (server, mut client) = start().await;
        for command in [
            doc! { "insert": "c", "documents": [{ "_id": 1 }], "bypassDocumentValidation": true, "$db": "db" },
            doc! { "update": "c", "updates": [{ "q": {}, "u": { "$set": { "x": 1 } }, "hint": "_id_" }], "$db": "db" },
            doc! { "delete": "c", "deletes": [{ "q": {}, "limit": 1, "collation": { "locale": "fr" } }], "$db": "db" },
            doc! { "aggregate": "c", "pipeline": [], "cursor": {}, "allowDiskUse": true, "$db": "db" },
        ] {
            let reply = client.command(command.clone()).await.unwrap();
            assert_eq!(code(&reply), Some(TESTKIT_UNSUPPORTED), "{command}: {reply}");
        }
        assert_eq!(server.handle().unsupported().len(), 4);
        server.shutdown().await;
    })
    .await;
}

/// Review13 finding 3 (TK-2, house rule 7): a `count` or `distinct` `query` that is not a
/// document is TypeMismatch (14) with the IDL parser's message, as on a real server (the
/// commands' IDL: `query: type: object`), never a match of every document.
#[tokio::test]
async fn review13_f3_a_query_that_is_not_a_document_is_type_mismatch() {
    bounded(async {
        let (server, mut client) = start().await;
        let insert = doc! { "insert": "c", "documents": [{ "a": 1 }, { "a": 2 }], "$db": "db" };
        assert_eq!(code(&client.command(insert).await.unwrap()), None);
        for (name, query, kind) in [
            ("count", Bson::Int32(5), "int"),
            ("count", Bson::String("x".into()), "string"),
            ("distinct", Bson::Int32(5), "int"),
            ("distinct", Bson::Array(vec![]), "array"),
        ] {
            let mut command = doc! { name: "c", "query": query, "$db": "db" };
            if name == "distinct" {
                command.insert("key", "a");
            }
            let reply = client.command(command.clone()).await.unwrap();
            assert_eq!(code(&reply), Some(14), "{command}: {reply}");
            let message = format!(
                "BSON field '{name}.query' is the wrong type '{kind}', expected type 'object'"
            );
            assert_eq!(reply.get_str("errmsg").ok(), Some(message.as_str()));
        }
        let count = doc! { "count": "c", "query": { "a": 2 }, "$db": "db" };
        let reply = client.command(count).await.unwrap();
        assert_eq!(reply.get_i32("n").ok(), Some(1), "{reply}");
        // Leftovers12 item 3: the server's IDL parser takes a `null` or `undefined` of the wrong
        // type as the field's absence (`IDLParserContext::checkAndAssertTypeSlowPath`): the
        // default, an empty query matching every document.
        for absent in [Bson::Null, Bson::Undefined] {
            let count = doc! { "count": "c", "query": absent.clone(), "$db": "db" };
            let reply = client.command(count).await.unwrap();
            assert_eq!(reply.get_i32("n").ok(), Some(2), "{absent:?}: {reply}");
            let distinct =
                doc! { "distinct": "c", "key": "a", "query": absent.clone(), "$db": "db" };
            let reply = client.command(distinct).await.unwrap();
            assert_eq!(
                reply.get_array("values").map(Vec::len).ok(),
                Some(2),
                "{absent:?}: {reply}"
            );
        }
        let distinct = doc! { "distinct": "c", "key": "a", "$db": "db" };
        let reply = client.command(distinct).await.unwrap();
        assert_eq!(
            reply.get_array("values").map(Vec::len).ok(),
            Some(2),
            "{reply}"
        );
        server.shutdown().await;
    })
    .await;
}

/// TK-6: a retryable write (lsid + txnNumber, no transaction) may not touch several documents:
/// `multi: true` and `limit: 0` are InvalidOptions (72).
#[tokio::test]
async fn multi_document_writes_refuse_a_txn_number() {
    bounded(async {
        let (server, mut client) = start_primary().await;
        let lsid = lsid_of(9);
        let update = doc! {
            "update": "c", "updates": [{ "q": {}, "u": { "$set": { "x": 1 } }, "multi": true }],
            "lsid": lsid.clone(), "txnNumber": 1_i64, "$db": "db",
        };
        assert_eq!(code(&client.command(update).await.unwrap()), Some(72));
        let delete = doc! {
            "delete": "c", "deletes": [{ "q": {}, "limit": 0 }],
            "lsid": lsid, "txnNumber": 2_i64, "$db": "db",
        };
        assert_eq!(code(&client.command(delete).await.unwrap()), Some(72));
        server.shutdown().await;
    })
    .await;
}

/// TK-5, TK-11: an update of two statements is a retryable write statement by statement: with
/// `onPrimaryTransactionalWrite {skip: 1}` the first statement commits, the second commits and
/// the connection closes; the retry runs neither again and answers for both.
#[tokio::test]
async fn statements_are_deduplicated_and_fire_one_by_one() {
    bounded(async {
        let (primary, mut client) = start_primary().await;
        let address = primary.address();
        let handle = primary.handle();
        handle.insert(
            "db.c",
            vec![doc! { "_id": 1, "x": 0 }, doc! { "_id": 2, "x": 0 }],
        );
        let set = doc! {
            "configureFailPoint": "onPrimaryTransactionalWrite", "mode": { "skip": 1 },
            "$db": "admin",
        };
        assert_eq!(code(&client.command(set).await.unwrap()), None);
        let update = doc! {
            "update": "c",
            "updates": [
                { "q": { "_id": 1 }, "u": { "$inc": { "x": 1 } } },
                { "q": { "_id": 2 }, "u": { "$inc": { "x": 1 } } },
            ],
            "lsid": lsid_of(5), "txnNumber": 1_i64, "$db": "db",
        };
        assert!(
            client.command(update.clone()).await.is_err(),
            "closed after statement 1"
        );
        let after = |id: i32| {
            handle
                .documents("db.c")
                .into_iter()
                .find(|d| d.get_i32("_id").ok() == Some(id))
                .and_then(|d| d.get_i32("x").ok())
        };
        assert_eq!((after(1), after(2)), (Some(1), Some(1)), "both committed");
        let mut client = RawClient::connect(address).await.unwrap();
        let retry = client.command(update).await.unwrap();
        assert_eq!(
            (retry.get_i32("n").ok(), retry.get_i32("nModified").ok()),
            (Some(2), Some(2)),
            "{retry}"
        );
        assert_eq!(
            (after(1), after(2)),
            (Some(1), Some(1)),
            "nothing ran twice"
        );
        primary.shutdown().await;
    })
    .await;
}

/// TK-16: the opt-in command log records each command with its lsid and txnNumber.
#[tokio::test]
async fn command_log() {
    bounded(async {
        let (server, mut client) = start().await;
        let handle = server.handle();
        client
            .command(doc! { "ping": 1, "$db": "admin" })
            .await
            .unwrap();
        assert!(handle.command_log().is_empty(), "off by default");
        handle.set_command_log(true);
        let lsid = lsid_of(3);
        client
            .command(
                doc! { "insert": "c", "documents": [{ "_id": 1 }], "lsid": lsid.clone(),
                "txnNumber": 4_i64, "$db": "db" },
            )
            .await
            .unwrap();
        let log = handle.command_log();
        assert_eq!(log.len(), 1);
        assert_eq!(
            (
                log[0].name.as_str(),
                log[0].lsid.as_ref(),
                log[0].txn_number
            ),
            ("insert", Some(&lsid), Some(4))
        );
        server.shutdown().await;
    })
    .await;
}

/// Review5 item 11 (SE-16, SE-21, house rule 7): a replica-set member's replies carry
/// `operationTime` and `$clusterTime` from the deployment's clock, which every write moves on;
/// a `readConcern.afterClusterTime` ahead of it is refused (72); a `w` above the set's size is a
/// `writeConcernError` 100 on an applied write, as on a real replica set.
#[tokio::test]
async fn cluster_time_and_write_concern_are_a_replica_sets() {
    bounded(async {
        let (server, mut client) = start_primary().await;
        let time = |reply: &Document| reply.get_timestamp("operationTime").expect("operationTime");
        let ping = client
            .command(doc! { "ping": 1, "$db": "admin" })
            .await
            .unwrap();
        let before = time(&ping);
        let cluster = ping.get_document("$clusterTime").expect("$clusterTime");
        assert_eq!(cluster.get_timestamp("clusterTime").ok(), Some(before));
        let insert = client
            .command(doc! {
                "insert": "c", "documents": [{ "_id": 1 }], "$db": "test",
                "writeConcern": { "w": 5 },
            })
            .await
            .unwrap();
        let after = time(&insert);
        assert!((after.time, after.increment) > (before.time, before.increment));
        let error = insert
            .get_document("writeConcernError")
            .expect("w: 5 on a one-member set");
        assert_eq!(code(error), Some(100));
        let ahead = bson::Timestamp {
            time: after.time,
            increment: after.increment + 1,
        };
        let refused = client
            .command(doc! {
                "find": "c", "$db": "test", "readConcern": { "afterClusterTime": ahead },
            })
            .await
            .unwrap();
        assert_eq!(code(&refused), Some(72), "{refused}");
        let fine = client
            .command(doc! {
                "find": "c", "$db": "test", "readConcern": { "afterClusterTime": after },
            })
            .await
            .unwrap();
        assert_eq!(first_batch(&fine).len(), 1);
        // SE-17 (review6 finding 8): the same afterClusterTime is accepted when the command
        // gossips a $clusterTime that covers it (the clock moves there first), and a malformed
        // $clusterTime is refused.
        let signature = doc! {
            "hash": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![0; 20] },
            "keyId": 0_i64,
        };
        let gossiped = client
            .command(doc! {
                "find": "c", "$db": "test", "readConcern": { "afterClusterTime": ahead },
                "$clusterTime": { "clusterTime": ahead, "signature": signature },
            })
            .await
            .unwrap();
        assert_eq!(first_batch(&gossiped).len(), 1, "{gossiped}");
        assert_eq!(time(&gossiped), ahead);
        let malformed = client
            .command(doc! {
                "ping": 1, "$db": "admin", "$clusterTime": { "clusterTime": ahead },
            })
            .await
            .unwrap();
        assert_eq!(code(&malformed), Some(4), "{malformed}");
        server.shutdown().await;
    })
    .await
}

/// TK-15 (house rule 7): a transaction statement that fails (here a duplicate key) aborts the
/// transaction, as on a real server: its writes are undone and its next statement gets
/// NoSuchTransaction (251).
#[tokio::test]
async fn a_failed_statement_aborts_its_transaction() {
    bounded(async {
        let (server, mut client) = start_primary().await;
        let statement = |id: i32, start: bool| {
            let insert = doc! { "insert": "t", "documents": [{ "_id": id }], "$db": "test" };
            in_transaction(insert, &lsid_of(9), 1, start)
        };
        let first = client.command(statement(1, true)).await.unwrap();
        assert_eq!(first.get_i32("n").ok(), Some(1), "{first}");
        let duplicate = client.command(statement(1, false)).await.unwrap();
        assert!(duplicate.contains_key("writeErrors"), "{duplicate}");
        let after = client.command(statement(2, false)).await.unwrap();
        assert_eq!(code(&after), Some(251), "{after}");
        let find = client
            .command(doc! { "find": "t", "$db": "test" })
            .await
            .unwrap();
        assert!(
            first_batch(&find).is_empty(),
            "the aborted insert is undone"
        );
        server.shutdown().await;
    })
    .await
}

/// TK-15: transaction 1 (lsid 1) starts by inserting `{_id: 1}` into `test.w`, which it then
/// holds until it ends.
async fn transaction_1_inserts_into_w(client: &mut RawClient) {
    let insert = doc! { "insert": "w", "documents": [{ "_id": 1 }], "$db": "test" };
    let first = client
        .command(in_transaction(insert, &lsid_of(1), 1, true))
        .await
        .unwrap();
    assert_eq!(first.get_i32("n").ok(), Some(1), "{first}");
}

/// TK-15, TK-7 (review7 finding 1): over the wire, a transaction's write to a document another
/// transaction in progress changed is WriteConflict 112 with `TransientTransactionError`; a write
/// outside any transaction is never 112: it waits for the transaction, until `maxTimeMS` runs out
/// (MaxTimeMSExpired, 50) or the transaction ends (then it runs on the committed data).
#[tokio::test]
async fn tk15_review7_f1_writes_wait_for_a_transaction_outside_and_conflict_inside() {
    bounded(async {
        let (server, mut client) = start_primary().await;
        let mut other = RawClient::connect(server.address()).await.unwrap();
        transaction_1_inserts_into_w(&mut client).await;
        let conflict = other
            .command(doc! {
                "update": "w", "updates": [{ "q": { "_id": 1 }, "u": { "$set": { "x": 1 } }, "upsert": true }],
                "$db": "test", "lsid": lsid_of(2), "txnNumber": 1_i64, "autocommit": false,
                "startTransaction": true,
            })
            .await
            .unwrap();
        assert_eq!(code(&conflict), Some(112), "{conflict}");
        assert_eq!(labels(&conflict), ["TransientTransactionError"]);
        let timed_out = other
            .command(doc! {
                "insert": "w", "documents": [{ "_id": 1 }], "$db": "test", "maxTimeMS": 50,
            })
            .await
            .unwrap();
        assert_eq!(code(&timed_out), Some(50), "{timed_out}");
        let waiting = tokio::spawn(async move {
            other
                .command(doc! {
                    "update": "w", "updates": [{ "q": { "_id": 1 }, "u": { "$set": { "x": 2 } }, "upsert": true }],
                    "$db": "test",
                })
                .await
                .unwrap()
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "the write waits for the transaction");
        let commit = client
            .command(end_transaction("commitTransaction", 1))
            .await
            .unwrap();
        assert_eq!(commit.get_f64("ok").ok(), Some(1.0), "{commit}");
        let updated = waiting.await.unwrap();
        assert_eq!(
            (updated.get_i32("n").ok(), updated.get_i32("nModified").ok()),
            (Some(1), Some(1)),
            "it ran on the committed document: {updated}"
        );
        server.shutdown().await;
    })
    .await
}

/// TK-15 (seventh session's note): over the wire, `$out` into a collection a transaction in
/// progress changed, and `$merge` of a document it changed, wait like any write outside a
/// transaction: until `maxTimeMS` runs out (MaxTimeMSExpired, 50), having written nothing; after
/// the commit they run.
#[tokio::test]
async fn tk15_out_and_merge_wait_for_a_transaction_holding_their_target() {
    bounded(async {
        let (server, mut client) = start_primary().await;
        let mut other = RawClient::connect(server.address()).await.unwrap();
        server
            .handle()
            .insert("test.src", vec![doc! { "_id": 1, "s": 1 }]);
        transaction_1_inserts_into_w(&mut client).await;
        for stage in [doc! { "$out": "w" }, doc! { "$merge": { "into": "w" } }] {
            let timed_out = other
                .command(doc! {
                    "aggregate": "src", "pipeline": [stage.clone()], "cursor": {},
                    "$db": "test", "maxTimeMS": 50,
                })
                .await
                .unwrap();
            assert_eq!(code(&timed_out), Some(50), "{stage}: {timed_out}");
        }
        let commit = client
            .command(end_transaction("commitTransaction", 1))
            .await
            .unwrap();
        assert_eq!(commit.get_f64("ok").ok(), Some(1.0), "{commit}");
        assert_eq!(server.handle().documents("test.w"), [doc! { "_id": 1 }]);
        let out = other
            .command(doc! {
                "aggregate": "src", "pipeline": [{ "$out": "w" }], "cursor": {},
                "$db": "test", "maxTimeMS": 50,
            })
            .await
            .unwrap();
        assert_eq!(out.get_f64("ok").ok(), Some(1.0), "{out}");
        assert_eq!(
            server.handle().documents("test.w"),
            [doc! { "_id": 1, "s": 1 }]
        );
        server.shutdown().await;
    })
    .await
}

/// TK-15 (leftovers10 item 4): over the wire, a `$out` into a collection that a transaction in
/// progress only read waits too (a real transaction holds the collection's lock until it ends),
/// until `maxTimeMS` runs out (50); after the abort it runs.
#[tokio::test]
async fn tk15_out_waits_for_a_transaction_that_only_read_its_target() {
    bounded(async {
        let (server, mut client) = start_primary().await;
        let mut other = RawClient::connect(server.address()).await.unwrap();
        let handle = server.handle();
        handle.insert("test.src", vec![doc! { "_id": 1, "s": 1 }]);
        handle.insert("test.w", vec![doc! { "_id": 2 }]);
        let read = client
            .command(doc! {
                "find": "w", "$db": "test", "lsid": lsid_of(1), "txnNumber": 1_i64,
                "autocommit": false, "startTransaction": true,
            })
            .await
            .unwrap();
        assert_eq!(read.get_f64("ok").ok(), Some(1.0), "{read}");
        let out = doc! {
            "aggregate": "src", "pipeline": [{ "$out": "w" }], "cursor": {},
            "$db": "test", "maxTimeMS": 50,
        };
        let timed_out = other.command(out.clone()).await.unwrap();
        assert_eq!(code(&timed_out), Some(50), "{timed_out}");
        assert_eq!(handle.documents("test.w"), [doc! { "_id": 2 }]);
        let abort = client
            .command(end_transaction("abortTransaction", 1))
            .await
            .unwrap();
        assert_eq!(abort.get_f64("ok").ok(), Some(1.0), "{abort}");
        let ran = other.command(out).await.unwrap();
        assert_eq!(ran.get_f64("ok").ok(), Some(1.0), "{ran}");
        assert_eq!(handle.documents("test.w"), [doc! { "_id": 1, "s": 1 }]);
        server.shutdown().await;
    })
    .await
}

/// TK-15 (leftovers11, house rule 7): a real server's pending DDL ("Pending DDL Operations and
/// Transactions"): while a `$out` waits for a transaction that holds its target, a new
/// transaction that accesses the target cannot lock it: LockTimeout (24, TransientTransactionError),
/// and that transaction is aborted (NoSuchTransaction, 251, after); a `find` outside any
/// transaction on the target reads it at once, as it is before the `$out` (fixes15c: lock-free
/// on 5.0+). A transaction or command on another collection runs, the holding transaction goes
/// on, and once the `$out` ran a new transaction on the target runs again.
#[tokio::test]
async fn tk15_a_waiting_out_holds_back_new_transactions_on_its_target() {
    bounded(async {
        let (server, mut client) = start_primary().await;
        let handle = server.handle();
        handle.insert("test.src", vec![doc! { "_id": 1, "s": 1 }]);
        handle.insert("test.w", vec![doc! { "_id": 2 }]);
        let in_transaction = |lsid: u8, mut body: Document, start: bool| {
            body.insert("$db", "test");
            in_transaction(body, &lsid_of(lsid), 1, start)
        };
        let find = |lsid: u8, start: bool| in_transaction(lsid, doc! { "find": "w" }, start);
        let reply = client.command(find(1, true)).await.unwrap();
        assert_eq!(code(&reply), None, "{reply}");
        let out = doc! { "aggregate": "src", "pipeline": [{ "$out": "w" }], "cursor": {},
        "$db": "test", "maxTimeMS": 10_000 };
        let (out, _) = sent(&server, out).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!out.is_finished(), "the $out waits");

        let mut third = RawClient::connect(server.address()).await.unwrap();
        let insert = in_transaction(2, doc! { "insert": "w", "documents": [{ "_id": 3 }] }, true);
        let refused = third.command(insert).await.unwrap();
        assert_eq!(code(&refused), Some(24), "{refused}");
        assert_eq!(labels(&refused), ["TransientTransactionError"], "{refused}");
        let after = third.command(find(2, false)).await.unwrap();
        assert_eq!(code(&after), Some(251), "aborted: {after}");
        let elsewhere =
            in_transaction(3, doc! { "insert": "x", "documents": [{ "_id": 1 }] }, true);
        let reply = third.command(elsewhere).await.unwrap();
        assert_eq!(code(&reply), None, "another collection: {reply}");
        let reply = client.command(find(1, false)).await.unwrap();
        assert_eq!(
            code(&reply),
            None,
            "the holding transaction goes on: {reply}"
        );
        // Fixes15c (house rule 7): outside a transaction a 5.0+ server reads lock-free
        // (`db_raii.cpp`, `supportsLockFreeRead`), so the find runs at once, before the `$out`.
        let outside = doc! { "find": "w", "$db": "test", "maxTimeMS": 100 };
        let reply = third.command(outside).await.unwrap();
        assert_eq!(
            code(&reply),
            None,
            "outside a transaction it reads: {reply}"
        );
        assert_eq!(first_batch(&reply), [doc! { "_id": 2 }], "{reply}");
        let other = doc! { "find": "x", "$db": "test", "maxTimeMS": 100 };
        let reply = third.command(other).await.unwrap();
        assert_eq!(code(&reply), None, "another collection: {reply}");

        let reply = third
            .command(end_transaction("abortTransaction", 3))
            .await
            .unwrap();
        assert_eq!(code(&reply), None, "{reply}");
        let reply = client
            .command(end_transaction("abortTransaction", 1))
            .await
            .unwrap();
        assert_eq!(code(&reply), None, "{reply}");
        let ran = out.await.expect("the $out task");
        assert_eq!(code(&ran), None, "{ran}");
        assert_eq!(handle.documents("test.w"), [doc! { "_id": 1, "s": 1 }]);
        let insert = in_transaction(4, doc! { "insert": "w", "documents": [{ "_id": 5 }] }, true);
        let reply = third.command(insert).await.unwrap();
        assert_eq!(code(&reply), None, "no DDL waits any more: {reply}");
        server.shutdown().await;
    })
    .await
}

/// TK-15 (leftovers12 item 5, house rule 7): a command outside any transaction queued behind a
/// pending DDL command runs after it, even once the transaction the DDL waited for has ended:
/// the server's lock manager grants a collection's lock requests from the front of its queue
/// (`lock_manager.cpp`, `LockManager::_onLockModeChanged`), and a new request queues behind a
/// waiting conflicting one. Two transactions hold `w`; a `drop` of `w` waits; an `insert` into
/// `w` queues behind it. The first transaction's end lets neither run (the drop waits for the
/// second); after the second's, the drop runs, then the insert, which creates `w` again.
#[tokio::test]
async fn item5_a_command_queued_behind_a_pending_ddl_runs_after_it() {
    bounded(async {
        let (server, mut client) = start_primary().await;
        let handle = server.handle();
        handle.insert("test.w", vec![doc! { "_id": 1 }]);
        for lsid in [1, 2] {
            let find = doc! { "find": "w", "$db": "test" };
            let find = in_transaction(find, &lsid_of(lsid), 1, true);
            let reply = client.command(find).await.unwrap();
            assert_eq!(code(&reply), None, "{reply}");
        }
        let (drop, _) = sent(&server, doc! { "drop": "w", "$db": "test" }).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let insert = doc! { "insert": "w", "documents": [{ "_id": 9 }], "$db": "test" };
        let (insert, _) = sent(&server, insert).await;
        let reply = client
            .command(end_transaction("abortTransaction", 1))
            .await
            .unwrap();
        assert_eq!(code(&reply), None, "{reply}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !drop.is_finished(),
            "the drop waits for the second transaction"
        );
        assert!(
            !insert.is_finished(),
            "the insert stays queued behind the drop"
        );
        assert_eq!(handle.documents("test.w"), [doc! { "_id": 1 }]);
        let reply = client
            .command(end_transaction("abortTransaction", 2))
            .await
            .unwrap();
        assert_eq!(code(&reply), None, "{reply}");
        let dropped = drop.await.expect("the drop task");
        assert_eq!(code(&dropped), None, "{dropped}");
        let inserted = insert.await.expect("the insert task");
        assert_eq!(inserted.get_i32("n").ok(), Some(1), "{inserted}");
        assert_eq!(
            handle.documents("test.w"),
            [doc! { "_id": 9 }],
            "the drop ran first, the insert made w again"
        );
        server.shutdown().await;
    })
    .await
}

/// TK-15: sends `body` on a new connection; returns its task, and the command's name, once the
/// server received it (waiting at most a second, in 5 ms steps).
async fn sent(server: &TestServer, body: Document) -> (tokio::task::JoinHandle<Document>, String) {
    let handle = server.handle();
    let name = body.keys().next().cloned().unwrap_or_default();
    let before = handle.counters().command(&name).received;
    let mut sender = RawClient::connect(server.address()).await.unwrap();
    let task = tokio::spawn(async move { sender.command(body).await.unwrap() });
    for _ in 0..200 {
        if handle.counters().command(&name).received > before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (task, name)
}

/// Review37 W4: whether `get_more`, sent on a new connection, is still waiting after 50 ms (a
/// getMore's `maxTimeMS` is no deadline on a real server and refused on a non-awaitData cursor,
/// so a queued one is seen waiting, not timing out). The request is left queued.
async fn get_more_queues(server: &TestServer, get_more: Document) -> bool {
    let (task, _) = sent(server, get_more).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let queued = !task.is_finished();
    task.abort();
    queued
}

/// TK-15 (review15 finding 1, docs13): what the lock-queueing tests share. A primary (of
/// [`start_primary`] or [`start_primary_at`]); `client`, for transaction 1 (lsid 1), which reads
/// `test.w` and which the pending DDL command waits for; `other`, a second connection for the
/// commands under test. A test seeds the store, makes a DDL command wait ([`LockTest::pend`]),
/// checks what queues behind it and what does not, then ends transaction 1
/// ([`LockTest::release`]; [`LockTest::finish`] also checks the DDL waited until then and shuts
/// the server down).
struct LockTest {
    server: TestServer,
    client: RawClient,
    other: RawClient,
    ddl: Option<tokio::task::JoinHandle<Document>>,
}

impl LockTest {
    /// A lock test on the server and client that [`start_primary`] or [`start_primary_at`]
    /// started.
    async fn on((server, client): (TestServer, RawClient)) -> LockTest {
        let other = RawClient::connect(server.address()).await.unwrap();
        LockTest {
            server,
            client,
            other,
            ddl: None,
        }
    }

    /// Transaction 1 reads `test.w`; then the DDL command `body` (on `test`), sent on a new
    /// connection, waits for it. Returns once the server received it.
    async fn pend(&mut self, body: Document) {
        let find = doc! {
            "find": "w", "$db": "test", "lsid": lsid_of(1), "txnNumber": 1_i64,
            "autocommit": false, "startTransaction": true,
        };
        let reply = self.client.command(find).await.unwrap();
        assert_eq!(code(&reply), None, "{reply}");
        let (ddl, name) = sent(&self.server, body).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!ddl.is_finished(), "the {name} waits for transaction 1");
        self.ddl = Some(ddl);
    }

    /// [`LockTest::pend`] with a `drop` of `test.w`.
    async fn pend_drop_of_w(&mut self) {
        self.pend(doc! { "drop": "w", "$db": "test" }).await;
    }

    /// Inserts `{_id: 1}` into each of `namespaces`.
    fn seed(&self, namespaces: &[&str]) {
        for namespace in namespaces {
            self.server
                .handle()
                .insert(namespace, vec![doc! { "_id": 1 }]);
        }
    }

    /// Whether the pending DDL command still waits.
    fn ddl_waits(&self) -> bool {
        !self.ddl.as_ref().expect("a pending DDL").is_finished()
    }

    /// Ends transaction 1; the pending DDL command then runs, and succeeds.
    async fn release(&mut self) {
        let abort = end_transaction("abortTransaction", 1);
        let reply = self.client.command(abort).await.unwrap();
        assert_eq!(code(&reply), None, "{reply}");
        let ddl = self.ddl.take().expect("a pending DDL");
        let ran = ddl.await.expect("the DDL's task");
        assert_eq!(code(&ran), None, "{ran}");
    }

    /// Checks the pending DDL command still waits (`waits` says so when it does not), releases
    /// it and shuts the server down.
    async fn finish(mut self, waits: &str) {
        assert!(self.ddl_waits(), "{waits}");
        self.release().await;
        self.server.shutdown().await;
    }
}

/// Review15 finding 1 (TK-15, TK-7, house rule 7): each `bulkWrite` op locks its `nsInfo`
/// namespace as it runs (the server's `bulk_write.cpp` through `write_ops_exec`). While a drop
/// of `w` is pending, a new transaction's bulkWrite inserting into `x`, then into `w` gets
/// LockTimeout 24 + TransientTransactionError and is aborted (251 after, the insert into `x`
/// undone); outside a transaction a bulkWrite into `w` queues behind the drop (until its
/// `maxTimeMS`, 50) while one into `x` alone runs; after the drop a transaction's bulkWrite
/// into `w` runs.
#[tokio::test]
async fn tk15_bulk_write_in_a_new_transaction_on_a_pending_drops_namespace_gets_24() {
    bounded(async {
        let mut lock = LockTest::on(start_primary().await).await;
        let handle = lock.server.handle();
        handle.insert("test.w", vec![doc! { "_id": 1 }]);
        lock.pend_drop_of_w().await;
        let other = &mut lock.other;
        let bulk = |ops: Vec<Document>, ns_info: Vec<Document>| {
            doc! { "bulkWrite": 1, "ops": ops, "nsInfo": ns_info, "$db": "admin" }
        };
        let in_transaction =
            |body: Document, lsid: u8, start: bool| in_transaction(body, &lsid_of(lsid), 1, start);
        let x_then_w = bulk(
            vec![
                doc! { "insert": 0, "document": { "_id": 7 } },
                doc! { "insert": 1, "document": { "_id": 8 } },
            ],
            vec![doc! { "ns": "test.x" }, doc! { "ns": "test.w" }],
        );
        let refused = other
            .command(in_transaction(x_then_w, 2, true))
            .await
            .unwrap();
        assert_eq!(code(&refused), Some(24), "{refused}");
        assert_eq!(labels(&refused), ["TransientTransactionError"], "{refused}");
        let after = other
            .command(in_transaction(
                doc! { "find": "x", "$db": "test" },
                2,
                false,
            ))
            .await
            .unwrap();
        assert_eq!(code(&after), Some(251), "aborted: {after}");
        assert!(
            handle.documents("test.x").is_empty(),
            "the insert into x undone"
        );

        let into_w = bulk(
            vec![doc! { "insert": 0, "document": { "_id": 9 } }],
            vec![doc! { "ns": "test.w" }],
        );
        let mut queued = into_w.clone();
        queued.insert("maxTimeMS", 100);
        let queued = other.command(queued).await.unwrap();
        assert_eq!(
            code(&queued),
            Some(50),
            "outside a transaction it queues: {queued}"
        );
        let into_x = bulk(
            vec![doc! { "insert": 0, "document": { "_id": 10 } }],
            vec![doc! { "ns": "test.x" }],
        );
        let ran = other.command(into_x).await.unwrap();
        assert_eq!(
            ran.get_i32("nInserted").ok(),
            Some(1),
            "another namespace: {ran}"
        );
        assert!(lock.ddl_waits());

        lock.release().await;
        let ran = lock
            .other
            .command(in_transaction(into_w, 3, true))
            .await
            .unwrap();
        assert_eq!(code(&ran), None, "no DDL pending any more: {ran}");
        assert_eq!(ran.get_i32("nInserted").ok(), Some(1), "{ran}");
        lock.server.shutdown().await;
    })
    .await
}

/// Review15 finding 1 (TK-15, TK-2, house rule 7): the aggregate shapes that lock namespaces
/// other than the one their first field names. `{aggregate: 1}` locks none and needs a first
/// stage that reads no collection (the server's `pipeline.cpp`: InvalidNamespace 73, also with
/// a drop pending). A `$merge` locks its target, so outside a transaction it queues behind a
/// drop pending there (50 at its `maxTimeMS`, nothing merged). A `$lookup`, `$unionWith` or
/// `$graphLookup` of the pending namespace in a new transaction is refused loudly
/// (TestkitUnsupported, logged), never run.
#[tokio::test]
async fn tk15_aggregates_locking_other_namespaces_check_them_or_are_refused() {
    bounded(async {
        let mut lock = LockTest::on(start_primary().await).await;
        let handle = lock.server.handle();
        handle.insert("test.w", vec![doc! { "_id": 1 }]);
        handle.insert("test.src", vec![doc! { "_id": 2, "a": 1 }]);
        lock.pend_drop_of_w().await;
        let other = &mut lock.other;
        let db_level = doc! {
            "aggregate": 1, "pipeline": [{ "$match": {} }], "cursor": {}, "$db": "test",
        };
        let refused = other.command(db_level).await.unwrap();
        assert_eq!(code(&refused), Some(73), "{refused}");
        assert_eq!(
            refused.get_str("errmsg").ok(),
            Some("{aggregate: 1} is not valid for '$match'; a collection is required.")
        );
        let merge = doc! {
            "aggregate": "src", "pipeline": [{ "$merge": { "into": "w" } }], "cursor": {},
            "$db": "test", "maxTimeMS": 100,
        };
        let queued = other.command(merge).await.unwrap();
        assert_eq!(code(&queued), Some(50), "the $merge queues: {queued}");
        assert_eq!(handle.documents("test.w"), [doc! { "_id": 1 }]);
        let stages = [
            ("$lookup", doc! { "$lookup": { "from": "w", "localField": "a", "foreignField": "a", "as": "j" } }),
            ("$unionWith", doc! { "$unionWith": "w" }),
            ("$graphLookup", doc! { "$graphLookup": { "from": "w", "startWith": "$a",
                "connectFromField": "a", "connectToField": "a", "as": "g" } }),
        ];
        for (lsid, (name, stage)) in (2_u8..).zip(stages) {
            let read = doc! {
                "aggregate": "src", "pipeline": [stage], "cursor": {}, "$db": "test",
                "lsid": lsid_of(lsid), "txnNumber": 1_i64, "autocommit": false,
                "startTransaction": true,
            };
            let refused = other.command(read).await.unwrap();
            assert_eq!(code(&refused), Some(TESTKIT_UNSUPPORTED), "{name}: {refused}");
            let logged = format!("pipeline stage {name}");
            let log = handle.unsupported();
            assert!(log.iter().any(|e| e.contains(&logged)), "{name} logged: {log:?}");
        }
        lock.finish("the drop still waits").await;
    })
    .await
}

/// Review15 finding 1 (TK-15, TK-3, house rule 7): a getMore outside a transaction reads
/// lock-free on a 5.0+ server (`getmore_cmd.cpp`: `AutoGetCollectionForReadMaybeLockFree`;
/// `db_raii.cpp`: `supportsLockFreeRead` outside a multi-document transaction), so it takes no
/// collection lock and does not queue behind a drop pending on its cursor's namespace: it gets
/// its next batch while the drop waits.
#[tokio::test]
async fn tk15_get_more_outside_a_transaction_does_not_queue_behind_a_pending_drop() {
    bounded(async {
        let mut lock = LockTest::on(start_primary().await).await;
        let handle = lock.server.handle();
        handle.insert("test.w", vec![doc! { "_id": 1 }, doc! { "_id": 2 }]);
        let find = doc! { "find": "w", "batchSize": 1, "$db": "test" };
        let first = lock.other.command(find).await.unwrap();
        let cursor = first.get_document("cursor").expect("a cursor");
        let id = cursor.get_i64("id").expect("an open cursor");
        assert_ne!(id, 0, "{first}");
        lock.pend_drop_of_w().await;
        let get_more = doc! { "getMore": id, "collection": "w", "$db": "test" };
        let next = lock.other.command(get_more).await.unwrap();
        assert_eq!(code(&next), None, "it runs at once: {next}");
        let batch = next
            .get_document("cursor")
            .and_then(|c| c.get_array("nextBatch"))
            .expect("a next batch");
        assert_eq!(batch, &vec![Bson::Document(doc! { "_id": 2 })]);
        lock.finish("the drop still waits").await;
    })
    .await
}

/// TK-15 (review12 finding 1): over the wire, `drop` and `dropDatabase` of what a transaction
/// in progress wrote wait for it, until `maxTimeMS` runs out (50), having dropped nothing; after
/// the abort the drop runs and the collection stays gone (the abort does not bring back the
/// documents it had updated).
#[tokio::test]
async fn tk15_drop_waits_for_a_transaction_that_wrote_the_collection() {
    bounded(async {
        let (server, mut client) = start_primary().await;
        let mut other = RawClient::connect(server.address()).await.unwrap();
        let handle = server.handle();
        handle.insert("test.w", vec![doc! { "_id": 1 }, doc! { "_id": 2 }]);
        let update = client
            .command(doc! {
                "update": "w", "updates": [{ "q": { "_id": 1 }, "u": { "$set": { "x": 1 } } }],
                "$db": "test", "lsid": lsid_of(1), "txnNumber": 1_i64, "autocommit": false,
                "startTransaction": true,
            })
            .await
            .unwrap();
        assert_eq!(update.get_i32("nModified").ok(), Some(1), "{update}");
        for drop in [
            doc! { "drop": "w", "$db": "test", "maxTimeMS": 50 },
            doc! { "dropDatabase": 1, "$db": "test", "maxTimeMS": 50 },
        ] {
            let timed_out = other.command(drop.clone()).await.unwrap();
            assert_eq!(code(&timed_out), Some(50), "{drop}: {timed_out}");
        }
        assert_eq!(handle.documents("test.w").len(), 2, "nothing dropped");
        let abort = client
            .command(end_transaction("abortTransaction", 1))
            .await
            .unwrap();
        assert_eq!(abort.get_f64("ok").ok(), Some(1.0), "{abort}");
        let dropped = other
            .command(doc! { "drop": "w", "$db": "test", "maxTimeMS": 50 })
            .await
            .unwrap();
        assert_eq!(dropped.get_f64("ok").ok(), Some(1.0), "{dropped}");
        assert!(handle.documents("test.w").is_empty(), "it stays gone");
        server.shutdown().await;
    })
    .await
}

/// House rule 7 (leftovers10): over the wire, an update that would change a document's `_id`
/// is ImmutableField 66 as on a real server: a write error of `update` (the document unchanged),
/// the error of `findAndModify`; an upsert of an `_id` already there is DuplicateKey 11000.
#[tokio::test]
async fn an_update_never_changes_an_id_and_an_upsert_never_duplicates_one() {
    bounded(async {
        let (server, mut client) = start_primary().await;
        server
            .handle()
            .insert("test.c", vec![doc! { "_id": 1, "a": 1 }]);
        let update = |u: Document, upsert: bool| {
            doc! {
                "update": "c", "updates": [{ "q": { "_id": 1, "a": 1 }, "u": u, "upsert": upsert }],
                "$db": "test",
            }
        };
        let write_error = |reply: &Document| {
            reply
                .get_array("writeErrors")
                .ok()
                .and_then(|errors| errors[0].as_document().and_then(|e| e.get_i32("code").ok()))
        };
        for u in [
            doc! { "$set": { "_id": 2 } },
            doc! { "_id": 2 },
            doc! { "$unset": { "_id": 1 } },
        ] {
            let reply = client.command(update(u.clone(), false)).await.unwrap();
            assert_eq!(write_error(&reply), Some(66), "{u}: {reply}");
        }
        let reply = client
            .command(doc! {
                "findAndModify": "c", "query": { "_id": 1 }, "update": { "$set": { "_id": 3 } },
                "$db": "test",
            })
            .await
            .unwrap();
        assert_eq!(code(&reply), Some(66), "{reply}");
        assert_eq!(
            server.handle().documents("test.c"),
            [doc! { "_id": 1, "a": 1 }]
        );
        let upsert = doc! {
            "update": "c", "updates": [{ "q": { "_id": 1, "a": 2 }, "u": { "$set": { "b": 1 } },
            "upsert": true }], "$db": "test",
        };
        let reply = client.command(upsert).await.unwrap();
        assert_eq!(write_error(&reply), Some(11000), "{reply}");
        assert_eq!(server.handle().documents("test.c").len(), 1);
        server.shutdown().await;
    })
    .await
}

/// A document nested `levels` deep (itself included), each level `{a: ...}`, the last `{a: 1}`.
fn nested(levels: usize) -> Document {
    let mut document = doc! { "a": 1 };
    for _ in 1..levels {
        document = doc! { "a": document };
    }
    document
}

/// Review7 finding 3 (house rule 7): a stored document may have 100 levels of nesting, not 101
/// (the server's `getMaxDepthForUserStorage`, Overflow 15, as a write error): an insert of one
/// and an update that would make one are refused, an ordered insert stops there, an unordered
/// one goes on.
#[tokio::test]
async fn review7_f3_stored_documents_are_at_most_100_levels_deep() {
    bounded(async {
        let (server, mut client) = start().await;
        let mut deepest = nested(100);
        deepest.insert("_id", 1);
        let mut too_deep = nested(101);
        too_deep.insert("_id", 2);
        let insert = client
            .command(doc! {
                "insert": "deep", "documents": [deepest, too_deep, { "_id": 3 }],
                "ordered": false, "$db": "test",
            })
            .await
            .unwrap();
        assert_eq!(insert.get_i32("n").ok(), Some(2), "{insert}");
        let errors = insert.get_array("writeErrors").unwrap();
        let error = errors[0].as_document().unwrap();
        assert_eq!(
            (errors.len(), error.get_i32("index").ok(), code(error)),
            (1, Some(1), Some(15)),
            "{insert}"
        );
        let ordered = client
            .command(doc! {
                "insert": "deep2", "documents": [nested(101), { "_id": 5 }], "$db": "test",
            })
            .await
            .unwrap();
        assert_eq!(ordered.get_i32("n").ok(), Some(0), "{ordered}");
        let update = client
            .command(doc! {
                "update": "deep", "updates": [{ "q": { "_id": 3 }, "u": { "$set": { "x": nested(100) } } }],
                "$db": "test",
            })
            .await
            .unwrap();
        let error = update.get_array("writeErrors").unwrap()[0].as_document().unwrap().clone();
        assert_eq!((code(&error), update.get_i32("nModified").ok()), (Some(15), Some(0)), "{update}");
        server.shutdown().await;
    })
    .await
}

/// TK-5, TK-15 (review7 finding 1): a retryable write of several statements outside any
/// transaction that reaches a document a transaction in progress changed waits at that
/// statement; after the commit it goes on from there: the statements before it ran once.
#[tokio::test]
async fn tk15_review7_f1_a_waiting_retryable_write_resumes_at_its_statement() {
    bounded(async {
        let (server, mut client) = start_primary().await;
        server.handle().insert(
            "test.r",
            vec![doc! { "_id": 0, "n": 0 }, doc! { "_id": 1, "n": 0 }],
        );
        let mut other = RawClient::connect(server.address()).await.unwrap();
        let opened = client
            .command(doc! {
                "update": "r", "updates": [{ "q": { "_id": 1 }, "u": { "$set": { "t": 1 } } }],
                "$db": "test", "lsid": lsid_of(1), "txnNumber": 1_i64, "autocommit": false,
                "startTransaction": true,
            })
            .await
            .unwrap();
        assert_eq!(opened.get_i32("nModified").ok(), Some(1), "{opened}");
        let waiting = tokio::spawn(async move {
            other
                .command(doc! {
                    "update": "r",
                    "updates": [
                        { "q": { "_id": 0 }, "u": { "$inc": { "n": 1 } } },
                        { "q": { "_id": 1 }, "u": { "$inc": { "n": 1 } } },
                    ],
                    "$db": "test", "lsid": lsid_of(2), "txnNumber": 1_i64,
                })
                .await
                .unwrap()
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "the second statement waits");
        client
            .command(end_transaction("commitTransaction", 1))
            .await
            .unwrap();
        let updated = waiting.await.unwrap();
        assert_eq!(updated.get_i32("nModified").ok(), Some(2), "{updated}");
        let documents = server.handle().documents("test.r");
        let n: Vec<i32> = documents.iter().map(|d| d.get_i32("n").unwrap()).collect();
        assert_eq!(n, [1, 1], "each statement ran once: {documents:?}");
        server.shutdown().await;
    })
    .await
}

/// TK-15: `$out` and `$merge` cannot run in a transaction (OperationNotSupportedInTransaction,
/// 263, as a real server's `DocumentSourceOut` refuses it); nothing is written.
#[tokio::test]
async fn tk15_out_and_merge_are_refused_in_a_transaction() {
    bounded(async {
        let (server, mut client) = start_primary().await;
        server.handle().insert("test.src", vec![doc! { "_id": 1 }]);
        for (number, stage) in [
            (1_i64, doc! { "$out": "dst" }),
            (2, doc! { "$merge": { "into": "dst" } }),
        ] {
            let reply = client
                .command(doc! {
                    "aggregate": "src", "pipeline": [stage], "cursor": {}, "$db": "test",
                    "lsid": lsid_of(3), "txnNumber": number, "autocommit": false,
                    "startTransaction": true,
                })
                .await
                .unwrap();
            assert_eq!(code(&reply), Some(263), "{reply}");
        }
        assert!(server.handle().documents("test.dst").is_empty());
        server.shutdown().await;
    })
    .await
}

/// UT-25, TK-15 (review8 finding 3): `killAllSessions` aborts the transactions in progress of
/// the sessions it kills, as a real server does, so a later write outside any transaction to a
/// document one of them changed does not wait; `killSessions` does the same for the sessions
/// it names. The killed transaction cannot commit (NoSuchTransaction 251).
#[tokio::test]
async fn tk15_review8_f3_killing_sessions_aborts_their_transactions() {
    bounded(async {
        let (server, mut client) = start_primary().await;
        let start = |session: u8, id: i32| {
            doc! {
                "insert": "k", "documents": [{ "_id": id }], "$db": "test",
                "lsid": lsid_of(session), "txnNumber": 1_i64, "autocommit": false,
                "startTransaction": true,
            }
        };
        let outside = |id: i32| {
            doc! { "insert": "k", "documents": [{ "_id": id }], "$db": "test", "maxTimeMS": 1000 }
        };
        let kills = [
            doc! { "killAllSessions": [], "$db": "admin" },
            doc! { "killSessions": [lsid_of(2)], "$db": "admin" },
        ];
        for (session, kill) in [1_u8, 2].into_iter().zip(kills) {
            let id = i32::from(session);
            let reply = client.command(start(session, id)).await.unwrap();
            assert_eq!(reply.get_i32("n").ok(), Some(1), "{reply}");
            let reply = client.command(kill).await.unwrap();
            assert_eq!(code(&reply), None, "{reply}");
            let reply = client.command(outside(id)).await.unwrap();
            assert_eq!(reply.get_i32("n").ok(), Some(1), "no wait: {reply}");
            let commit = client
                .command(end_transaction("commitTransaction", session))
                .await
                .unwrap();
            assert_eq!(code(&commit), Some(251), "{commit}");
        }
        server.shutdown().await;
    })
    .await
}

/// UT-25, TK-15 (review9 finding 2): killing sessions also closes their open cursors, as a real
/// server does: after `killSessions [S]` a getMore on S's cursor gets CursorNotFound (43) while
/// another session's cursor goes on; after `killAllSessions []` every cursor opened in a session
/// is gone, and one opened outside any session goes on.
#[tokio::test]
async fn tk15_review9_f2_killing_sessions_closes_their_cursors() {
    bounded(async {
        let (server, mut client) = start_primary().await;
        let documents: Vec<Document> = (0..6).map(|i| doc! { "_id": i }).collect();
        server.handle().insert("test.c", documents);
        async fn open(client: &mut RawClient, session: Option<u8>) -> i64 {
            let mut find = doc! { "find": "c", "batchSize": 1, "$db": "test" };
            if let Some(session) = session {
                find.insert("lsid", lsid_of(session));
            }
            let reply = client.command(find).await.unwrap();
            let id = reply.get_document("cursor").unwrap().get_i64("id").unwrap();
            assert_ne!(id, 0, "a cursor stays open: {reply}");
            id
        }
        let s = open(&mut client, Some(1)).await;
        let t = open(&mut client, Some(2)).await;
        let none = open(&mut client, None).await;
        let get_more = |id: i64, session: Option<u8>| {
            let mut get_more =
                doc! { "getMore": id, "collection": "c", "batchSize": 1, "$db": "test" };
            if let Some(session) = session {
                get_more.insert("lsid", lsid_of(session));
            }
            get_more
        };
        let reply = client
            .command(doc! { "killSessions": [lsid_of(1)], "$db": "admin" })
            .await
            .unwrap();
        assert_eq!(code(&reply), None, "{reply}");
        let reply = client.command(get_more(s, Some(1))).await.unwrap();
        assert_eq!(code(&reply), Some(43), "S's cursor is closed: {reply}");
        for (id, session) in [(t, Some(2)), (none, None)] {
            let reply = client.command(get_more(id, session)).await.unwrap();
            assert_eq!(code(&reply), None, "not killed: {reply}");
        }
        let reply = client
            .command(doc! { "killAllSessions": [], "$db": "admin" })
            .await
            .unwrap();
        assert_eq!(code(&reply), None, "{reply}");
        let reply = client.command(get_more(t, Some(2))).await.unwrap();
        assert_eq!(code(&reply), Some(43), "T's cursor is closed: {reply}");
        let reply = client.command(get_more(none, None)).await.unwrap();
        assert_eq!(code(&reply), None, "opened outside any session: {reply}");
        server.shutdown().await;
    })
    .await
}

/// TK-11, TK-15 (review8 finding 5): `onPrimaryTransactionalWrite {times: 1}` is used up once by
/// a retryable write that first waits for a transaction in progress and then runs: it commits
/// and closes the connection on the rerun, for an insert and for an update (statement by
/// statement).
#[tokio::test]
async fn tk11_review8_f5_a_waiting_write_fires_on_primary_write_once() {
    bounded(async {
        let (server, mut client) = start_primary().await;
        let handle = server.handle();
        handle.insert("db.w", vec![doc! { "_id": 5 }]);
        let in_transaction = |session: u8, body: Document| {
            let mut body = body;
            body.extend(doc! {
                "lsid": lsid_of(session), "txnNumber": 1_i64, "autocommit": false,
                "startTransaction": true,
            });
            body
        };
        let writes = [
            (
                doc! { "insert": "w", "documents": [{ "_id": 1 }], "$db": "db" },
                doc! { "insert": "w", "documents": [{ "_id": 1 }], "$db": "db" },
            ),
            (
                doc! { "update": "w", "updates": [{ "q": { "_id": 5 }, "u": { "$set": { "x": 1 } } }], "$db": "db" },
                doc! { "update": "w", "updates": [{ "q": { "_id": 5 }, "u": { "$set": { "y": 1 } } }], "$db": "db" },
            ),
        ];
        for (round, (in_txn, outside)) in writes.into_iter().enumerate() {
            let session = 10 + 2 * round as u8;
            let reply = client.command(in_transaction(session, in_txn)).await.unwrap();
            assert_eq!(reply.get_i32("n").ok(), Some(1), "{reply}");
            let reply = client
                .command(doc! {
                    "configureFailPoint": "onPrimaryTransactionalWrite",
                    "mode": { "times": 1 }, "$db": "admin",
                })
                .await
                .unwrap();
            assert_eq!(code(&reply), None, "{reply}");
            let mut writer = RawClient::connect(server.address()).await.unwrap();
            let mut retryable = outside;
            retryable.insert("lsid", lsid_of(session + 1));
            retryable.insert("txnNumber", 1_i64);
            let waiting = tokio::spawn(async move { writer.command(retryable).await });
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(!waiting.is_finished(), "the write waits for the transaction");
            let abort = client
                .command(end_transaction("abortTransaction", session))
                .await
                .unwrap();
            assert_eq!(code(&abort), None, "{abort}");
            let result = waiting.await.unwrap();
            assert!(result.is_err(), "committed, then closed: {result:?}");
        }
        let documents = handle.documents("db.w");
        assert!(documents.iter().any(|d| d.get_i32("_id").ok() == Some(1)), "{documents:?}");
        assert!(
            documents.iter().any(|d| d.get_i32("y").ok() == Some(1) && d.get("x").is_none()),
            "{documents:?}"
        );
        server.shutdown().await;
    })
    .await
}

/// The primary of a one-member replica set reporting `max_wire_version`, and a client of it.
async fn start_primary_at(max_wire_version: i32) -> (TestServer, RawClient) {
    let config = ServerConfig {
        max_wire_version,
        ..ServerConfig::default()
    };
    let server = TestServer::start_replica_set("rs0", 1, config)
        .await
        .expect("replica set starts")
        .remove(0);
    let client = RawClient::connect(server.address()).await.unwrap();
    (server, client)
}

/// The reads whose collection lock a 5.0+ server skips outside a transaction, each on `test.w`,
/// with a `maxTimeMS` of 100 ms to bound a wait.
fn reads_of_w() -> [(&'static str, Document); 5] {
    let read = |mut body: Document| {
        body.extend(doc! { "$db": "test", "maxTimeMS": 100 });
        body
    };
    [
        ("find", read(doc! { "find": "w" })),
        ("count", read(doc! { "count": "w" })),
        ("distinct", read(doc! { "distinct": "w", "key": "_id" })),
        ("listIndexes", read(doc! { "listIndexes": "w" })),
        (
            "aggregate",
            read(doc! { "aggregate": "w", "pipeline": [{ "$match": {} }], "cursor": {} }),
        ),
    ]
}

/// Fixes15c (TK-15, TK-1, house rule 7): from 5.0 (wire 13) a server's `find`, `count`,
/// `distinct`, `listIndexes` and an aggregate's source read lock-free outside a multi-document
/// transaction (`db_raii.cpp`: `supportsLockFreeRead`; `find_cmd.cpp`, `count_cmd.cpp`,
/// `distinct.cpp`, `list_indexes.cpp`, `run_aggregate.cpp` take
/// `AutoGetCollectionForReadCommandMaybeLockFree`), so while a drop of `w` is pending they run
/// at once and see `w` as it is before the drop. A write outside a transaction still queues (50
/// at its `maxTimeMS`), a `$merge` into `w` too (its target is locked as a write), and a new
/// transaction's read still gets LockTimeout 24: inside a transaction nothing changes.
#[tokio::test]
async fn tk15_reads_outside_a_transaction_run_at_once_from_wire_13() {
    bounded(async {
        for wire in [13, 25] {
            let mut lock = LockTest::on(start_primary_at(wire).await).await;
            let handle = lock.server.handle();
            handle.insert("test.w", vec![doc! { "_id": 1 }]);
            lock.pend_drop_of_w().await;
            let other = &mut lock.other;
            for (name, read) in reads_of_w() {
                let reply = other.command(read).await.unwrap();
                assert_eq!(code(&reply), None, "wire {wire}, {name} runs: {reply}");
                let seen = match name {
                    "count" => reply.get_i32("n").ok() == Some(1),
                    "distinct" => reply.get_array("values").ok() == Some(&vec![Bson::Int32(1)]),
                    "listIndexes" => first_batch(&reply).len() == 1,
                    _ => first_batch(&reply) == [doc! { "_id": 1 }],
                };
                assert!(seen, "wire {wire}, {name} sees w before the drop: {reply}");
            }
            let insert = doc! {
                "insert": "w", "documents": [{ "_id": 2 }], "$db": "test", "maxTimeMS": 100,
            };
            let queued = other.command(insert).await.unwrap();
            assert_eq!(
                code(&queued),
                Some(50),
                "wire {wire}, a write queues: {queued}"
            );
            let merge = doc! {
                "aggregate": "w", "pipeline": [{ "$merge": { "into": "w" } }], "cursor": {},
                "$db": "test", "maxTimeMS": 100,
            };
            let queued = other.command(merge).await.unwrap();
            assert_eq!(
                code(&queued),
                Some(50),
                "wire {wire}, $merge queues: {queued}"
            );
            let in_transaction = doc! {
                "find": "w", "$db": "test", "lsid": lsid_of(2), "txnNumber": 1_i64,
                "autocommit": false, "startTransaction": true,
            };
            let refused = other.command(in_transaction).await.unwrap();
            assert_eq!(
                code(&refused),
                Some(24),
                "wire {wire}, in a transaction: {refused}"
            );
            assert!(lock.ddl_waits(), "wire {wire}: the drop still waits");
            lock.release().await;
            assert!(
                handle.documents("test.w").is_empty(),
                "wire {wire}: dropped"
            );
            lock.server.shutdown().await;
        }
    })
    .await
}

/// Fixes15c (TK-15, TK-1, house rule 7): a server before 5.0 (wire 12 and below: 4.4) takes the
/// collection's IS lock for every read, which queues behind the pending drop's X request
/// (`lock_manager.cpp`), so the same reads outside a transaction wait (50 at their
/// `maxTimeMS`), and so does the getMore of a `find` cursor (`getmore_cmd.cpp`: its executor
/// is `kLockExternally`), while the cursor of an aggregate that stays a pipeline (an
/// `$addFields`), which locks only to read more from the collection (`kLocksInternally`; its
/// two documents were read at once), gets its next batch.
/// A `$changeStream` locks the oplog, not the collection it watches (`run_aggregate.cpp`), so it
/// opens at once on every version.
#[tokio::test]
async fn tk15_reads_outside_a_transaction_queue_behind_a_pending_ddl_before_wire_13() {
    bounded(async {
        let mut lock = LockTest::on(start_primary_at(12).await).await;
        let handle = lock.server.handle();
        handle.insert("test.w", vec![doc! { "_id": 1 }, doc! { "_id": 2 }]);
        let find = doc! { "find": "w", "batchSize": 1, "$db": "test" };
        let aggregate = doc! {
            "aggregate": "w", "pipeline": [{ "$addFields": { "a": 1 } }],
            "cursor": { "batchSize": 1 }, "$db": "test",
        };
        let mut cursors = Vec::new();
        for open in [find, aggregate] {
            let first = lock.other.command(open).await.unwrap();
            let id = first.get_document("cursor").and_then(|c| c.get_i64("id"));
            cursors.push(id.expect("an open cursor"));
        }
        lock.pend_drop_of_w().await;
        for (name, read) in reads_of_w() {
            let queued = lock.other.command(read).await.unwrap();
            assert_eq!(code(&queued), Some(50), "{name} queues: {queued}");
        }
        let get_more = |id: i64| {
            doc! { "getMore": id, "collection": "w", "$db": "test" }
        };
        assert!(
            get_more_queues(&lock.server, get_more(cursors[0])).await,
            "a find cursor's getMore queues"
        );
        let next = lock.other.command(get_more(cursors[1])).await.unwrap();
        let batch = next
            .get_document("cursor")
            .and_then(|c| c.get_array("nextBatch"));
        assert_eq!(
            batch.ok(),
            Some(&vec![Bson::Document(doc! { "_id": 2, "a": 1 })]),
            "{next}"
        );
        let watch = doc! {
            "aggregate": "w", "pipeline": [{ "$changeStream": {} }], "cursor": {},
            "$db": "test", "maxTimeMS": 100,
        };
        let opened = lock.other.command(watch).await.unwrap();
        assert_eq!(code(&opened), None, "a change stream opens: {opened}");
        assert!(lock.ddl_waits(), "the drop still waits");
        lock.release().await;
        assert!(handle.documents("test.w").is_empty());
        lock.server.shutdown().await;
    })
    .await
}

/// Review16 findings 1 and 2: sends `body` on a new connection and returns its task once the
/// server received it (it then waits, queued behind a pending drop).
async fn queued_command(server: &TestServer, body: Document) -> tokio::task::JoinHandle<Document> {
    let (task, name) = sent(server, body).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!task.is_finished(), "{name} queues behind the drop");
    task
}

/// Review16 finding 1 (TK-15, house rule 7): a command queued behind a pending DDL command keeps
/// its place: the server's lock manager grants a lock's queue from the front, compatible
/// requests together, stopping at the first that conflicts (`lock_manager.cpp`,
/// `LockManager::_onLockModeChanged`). Drop D1 of `w` pends (a transaction reads `w`); an
/// `insert` into `w` queues behind it; drop D2 of `w` arrives. Once D1 runs, the insert runs
/// before D2, so `w` ends dropped. Also for a retryable insert (lsid + txnNumber).
#[tokio::test]
async fn tk15_a_command_queued_behind_a_drop_runs_before_a_later_drop() {
    bounded(async {
        for retryable in [false, true] {
            let mut lock = LockTest::on(start_primary().await).await;
            let handle = lock.server.handle();
            handle.insert("test.w", vec![doc! { "_id": 1 }]);
            lock.pend_drop_of_w().await;
            let mut insert = doc! { "insert": "w", "documents": [{ "_id": 9 }], "$db": "test" };
            if retryable {
                insert.extend(doc! { "lsid": lsid_of(5), "txnNumber": 1_i64 });
            }
            let insert = queued_command(&lock.server, insert).await;
            let second = queued_command(&lock.server, doc! { "drop": "w", "$db": "test" }).await;
            lock.release().await;
            let inserted = insert.await.expect("the insert task");
            assert_eq!(inserted.get_i32("n").ok(), Some(1), "{inserted}");
            let dropped = second.await.expect("the second drop's task");
            assert_eq!(code(&dropped), None, "{dropped}");
            assert!(
                handle.documents("test.w").is_empty(),
                "retryable {retryable}: the insert ran before the second drop"
            );
            lock.server.shutdown().await;
        }
    })
    .await
}

/// Review16 finding 2 (TK-15, house rule 7): `create`, `createIndexes` and `dropIndexes` take
/// the collection's exclusive lock (MODE_X under the database's MODE_IX: the server's
/// `create_collection.cpp`, `index_builds_coordinator.cpp`, `drop_indexes.cpp`), so queued
/// behind a pending drop they hold their place as a DDL command does: a drop of `w` pends, a
/// `create` of `w` queues, then an `insert` into `w`, then a second drop of `w`. Once the first
/// drop ran, they run in that order: the create succeeds (had the insert run first, it would
/// have been NamespaceExists 48), the insert too, and the second drop drops `w` again.
#[tokio::test]
async fn tk15_a_create_queued_behind_a_drop_keeps_its_place() {
    bounded(async {
        let mut lock = LockTest::on(start_primary().await).await;
        let handle = lock.server.handle();
        handle.insert("test.w", vec![doc! { "_id": 1 }]);
        lock.pend_drop_of_w().await;
        let create = queued_command(&lock.server, doc! { "create": "w", "$db": "test" }).await;
        let insert = doc! { "insert": "w", "documents": [{ "_id": 9 }], "$db": "test" };
        let insert = queued_command(&lock.server, insert).await;
        let second = queued_command(&lock.server, doc! { "drop": "w", "$db": "test" }).await;
        lock.release().await;
        let created = create.await.expect("the create task");
        assert_eq!(code(&created), None, "the create ran first: {created}");
        let inserted = insert.await.expect("the insert task");
        assert_eq!(inserted.get_i32("n").ok(), Some(1), "{inserted}");
        let dropped = second.await.expect("the second drop's task");
        assert_eq!(code(&dropped), None, "the second drop ran last: {dropped}");
        assert!(handle.documents("test.w").is_empty());
        lock.server.shutdown().await;
    })
    .await
}

/// Docs13 (TK-15, house rule 7): the getMore of an aggregate cursor queues behind a drop pending
/// on its collection where the server answers the pipeline with its query layer alone: from 4.2
/// (wire 8) a pipeline that is empty once its leading `$match` stages (and a `$sort` the `_id`
/// index provides) are taken by the query is optimized away (`run_aggregate.cpp`,
/// `canOptimizeAwayPipeline`), its cursor takes the collection's IS lock on each getMore like a
/// `find` cursor (`kLockExternally`, `getmore_cmd.cpp`); from 4.4 (wire 9) any `$sort` and a
/// `$limit` are taken too (`pipeline_d.cpp`, `prepareExecutor`, `extractLimitForPushdown`). An
/// `$addFields` stays a pipeline stage, and 4.0 (wire 7) runs every aggregate as a pipeline,
/// whose getMore locks only when its `$cursor` stage reads more (`document_source_cursor.cpp`,
/// `loadBatch`; these documents were read at once), so those do not queue.
#[tokio::test]
async fn docs13_optimized_away_aggregate_cursors_queue_behind_a_pending_drop_before_wire_13() {
    bounded(async {
        let by_id = bson!([{ "$sort": { "_id": 1 } }]);
        let add_fields = bson!([{ "$addFields": { "a": 1 } }]);
        let matching = bson!([{ "$match": { "_id": { "$gte": 1 } } }]);
        // Per wire version: (pipeline, whether its cursor's getMore queues).
        let cases = [
            (7, vec![(bson!([]), false), (matching.clone(), false)]),
            (
                8,
                vec![
                    (bson!([]), true),
                    (matching.clone(), true),
                    (by_id.clone(), true),
                    (add_fields.clone(), false),
                ],
            ),
            (
                12,
                vec![
                    (bson!([]), true),
                    (matching.clone(), true),
                    (bson!([{ "$sort": { "x": 1 } }]), true),
                    (bson!([{ "$limit": 5 }]), true),
                    (
                        bson!([{ "$match": {} }, { "$sort": { "x": -1 } }, { "$limit": 5 }]),
                        true,
                    ),
                    // Review21 R1: adjacent `$sort`s merge; R2: an inclusion `$project` left
                    // at the front once the `$sort` (with its `$limit`) is taken is taken too.
                    (bson!([{ "$sort": { "x": 1 } }, { "$sort": { "_id": 1 } }]), true),
                    (
                        bson!([{ "$sort": { "x": 1 } }, { "$project": { "x": 1 } }, { "$limit": 5 }]),
                        true,
                    ),
                    (bson!([{ "$project": { "x": 0 } }]), false),
                    (add_fields.clone(), false),
                ],
            ),
        ];
        for (wire, pipelines) in cases {
            let mut lock = LockTest::on(start_primary_at(wire).await).await;
            let documents = vec![doc! { "_id": 1 }, doc! { "_id": 2 }];
            lock.server.handle().insert("test.w", documents);
            let mut cursors = Vec::new();
            for (pipeline, _) in &pipelines {
                let open = doc! {
                    "aggregate": "w", "pipeline": pipeline.clone(),
                    "cursor": { "batchSize": 1 }, "$db": "test",
                };
                let first = lock.other.command(open).await.unwrap();
                let id = first.get_document("cursor").and_then(|c| c.get_i64("id"));
                cursors.push(id.expect("an open cursor"));
            }
            lock.pend_drop_of_w().await;
            for ((pipeline, queues), id) in pipelines.iter().zip(&cursors) {
                let get_more =
                    doc! { "getMore": *id, "collection": "w", "$db": "test" };
                let case = format!("wire {wire} {pipeline}");
                if *queues {
                    assert!(
                        get_more_queues(&lock.server, get_more).await,
                        "{case} queues"
                    );
                } else {
                    let reply = lock.other.command(get_more).await.unwrap();
                    let batch = reply
                        .get_document("cursor")
                        .and_then(|c| c.get_array("nextBatch"));
                    assert!(
                        batch.is_ok_and(|b| b.len() == 1),
                        "{case} runs at once: {reply}"
                    );
                }
            }
            lock.finish("the drop still waits").await;
        }
    })
    .await
}

/// Docs13 (TK-15, house rule 7): before 5.0 `listCollections` takes the database's IS lock
/// (`list_collections.cpp`: `AutoGetDb` in MODE_IS), which queues behind a pending
/// `dropDatabase`'s X request (`lock_manager.cpp`), so it waits (50 at its `maxTimeMS`) on 4.2
/// and 4.4 alike, `nameOnly` or not, while one on another database runs; from 5.0 it reads the
/// catalog lock-free and runs at once.
#[tokio::test]
async fn docs13_list_collections_queues_behind_a_pending_drop_database_before_wire_13() {
    bounded(async {
        for wire in [8, 12, 25] {
            let mut lock = LockTest::on(start_primary_at(wire).await).await;
            lock.seed(&["test.w", "other.z"]);
            lock.pend(doc! { "dropDatabase": 1, "$db": "test" }).await;
            let other = &mut lock.other;
            for name_only in [true, false] {
                let list = doc! {
                    "listCollections": 1, "nameOnly": name_only, "$db": "test", "maxTimeMS": 100,
                };
                let reply = other.command(list).await.unwrap();
                let expected = (wire < 13).then_some(50);
                assert_eq!(
                    code(&reply),
                    expected,
                    "wire {wire} nameOnly {name_only}: {reply}"
                );
            }
            let list = doc! { "listCollections": 1, "$db": "other", "maxTimeMS": 100 };
            let reply = other.command(list).await.unwrap();
            assert_eq!(code(&reply), None, "wire {wire}, another database: {reply}");
            // The filter is parsed before any lock: a bad one fails at once.
            let bad = doc! { "listCollections": 1, "filter": 5, "$db": "test", "maxTimeMS": 100 };
            let reply = other.command(bad).await.unwrap();
            assert!(
                code(&reply).is_some_and(|c| c != 50),
                "wire {wire}, a bad filter: {reply}"
            );
            lock.finish("the dropDatabase still waits").await;
        }
    })
    .await
}

/// Docs13 (TK-15, house rule 7): before 5.0 `listCollections` also takes the IS lock of each
/// collection it lists, which queues behind a `drop` pending there: 4.4 for every listed
/// collection, `nameOnly` or not (`catalog::forEachCollectionFromDb` in MODE_IS), 4.2 only to
/// describe one (`nameOnly: false`, `buildCollectionBson`). A filter on exact names lists (and
/// locks) only those (`_getExactNameMatches`), so one naming another collection runs.
#[tokio::test]
async fn docs13_list_collections_queues_behind_a_pending_drop_of_a_listed_collection() {
    bounded(async {
        // (wire, nameOnly, filter, queues)
        let cases = [
            (12, true, None, true),
            (12, false, None, true),
            (12, true, Some(doc! { "name": "x" }), false),
            (12, true, Some(doc! { "name": { "$in": ["x", "w"] } }), true),
            (8, true, None, false),
            (8, false, None, true),
            (8, false, Some(doc! { "name": "x" }), false),
        ];
        for (wire, name_only, filter, queues) in cases {
            let mut lock = LockTest::on(start_primary_at(wire).await).await;
            lock.seed(&["test.w", "test.x"]);
            lock.pend_drop_of_w().await;
            let mut list = doc! {
                "listCollections": 1, "nameOnly": name_only, "$db": "test", "maxTimeMS": 100,
            };
            if let Some(filter) = &filter {
                list.insert("filter", filter.clone());
            }
            let reply = lock.other.command(list).await.unwrap();
            let case = format!("wire {wire} nameOnly {name_only} filter {filter:?}");
            assert_eq!(code(&reply), queues.then_some(50), "{case}: {reply}");
            lock.finish("the drop still waits").await;
        }
    })
    .await
}

/// Fixes18b (review18 finding 6, TK-15, house rule 7): before 4.2 a collection's DDL takes its
/// database's X lock (3.6's `drop_collection.cpp`: `AutoGetDb` in MODE_X; the 4.2 manual's
/// `drop` page: "Prior to MongoDB 4.2"), and `listCollections` the database's S lock on 3.6
/// (`AutoGetDb` in MODE_S), IS on 4.0 (`list_collections.cpp`): either queues behind that X
/// request, so on 3.6 (wire 6) and 4.0 (wire 7) a `listCollections` naming another collection,
/// `nameOnly` or not, waits behind a pending `drop` of `w` (50 at its `maxTimeMS`); on 4.2 (wire
/// 8) the drop takes the database's IX and it runs. One on another database runs. Only 4.0 is
/// run: the drop waits for a transaction, which a 3.6 server has none of (fixes18c), and the
/// test server emulates 3.6's locks as 4.0's.
#[tokio::test]
async fn review18_f6_list_collections_queues_behind_a_pending_collection_drop_before_wire_8() {
    bounded(async {
        for wire in [7, 8] {
            let mut lock = LockTest::on(start_primary_at(wire).await).await;
            lock.seed(&["test.w", "test.x", "other.z"]);
            lock.pend_drop_of_w().await;
            let other = &mut lock.other;
            for name_only in [true, false] {
                let list = doc! {
                    "listCollections": 1, "nameOnly": name_only, "filter": { "name": "x" },
                    "$db": "test", "maxTimeMS": 100,
                };
                let reply = other.command(list).await.unwrap();
                let case = format!("wire {wire} nameOnly {name_only}");
                assert_eq!(code(&reply), (wire < 8).then_some(50), "{case}: {reply}");
            }
            let list = doc! { "listCollections": 1, "$db": "other", "maxTimeMS": 100 };
            let reply = other.command(list).await.unwrap();
            assert_eq!(code(&reply), None, "wire {wire}, another database: {reply}");
            lock.finish(&format!("wire {wire}: the drop still waits"))
                .await;
        }
    })
    .await
}

/// Fixes18b (review18 finding 6, TK-15, house rule 7): before 4.2 a collection's DDL requests
/// its database's X lock (3.6's `drop_collection.cpp`: `AutoGetDb` in MODE_X; the 4.2 manual's
/// `drop` page, "Prior to MongoDB 4.2"), so on 4.0 (wire 7), while a `drop` of `w` is pending,
/// a command outside any transaction on another collection `x` of the database queues (50 at
/// its `maxTimeMS`) and a new transaction's command on `x` gets LockTimeout 24 with
/// TransientTransactionError; and a `drop` of `w` waits for a transaction that holds only `x`.
/// On 4.2 (wire 8) the drop locks `w` alone (the database's IX), and all of these run at once.
#[tokio::test]
async fn review18_f6_before_wire_8_a_collection_ddl_locks_its_database() {
    bounded(async {
        for wire in [7, 8] {
            let before_4_2 = wire < 8;
            let mut lock = LockTest::on(start_primary_at(wire).await).await;
            lock.seed(&["test.w", "test.x", "other.z"]);
            lock.pend_drop_of_w().await;
            let other = &mut lock.other;
            let find_x = doc! { "find": "x", "$db": "test", "maxTimeMS": 100 };
            let reply = other.command(find_x).await.unwrap();
            assert_eq!(
                code(&reply),
                before_4_2.then_some(50),
                "wire {wire}: {reply}"
            );
            let find_z = doc! { "find": "z", "$db": "other", "maxTimeMS": 100 };
            let reply = other.command(find_z).await.unwrap();
            assert_eq!(code(&reply), None, "wire {wire}, another database: {reply}");
            let in_transaction = doc! {
                "find": "x", "$db": "test", "lsid": lsid_of(2), "txnNumber": 1_i64,
                "autocommit": false, "startTransaction": true,
            };
            let reply = other.command(in_transaction).await.unwrap();
            if before_4_2 {
                assert_eq!(code(&reply), Some(24), "wire {wire}: {reply}");
                assert_eq!(labels(&reply), ["TransientTransactionError"], "{reply}");
            } else {
                assert_eq!(code(&reply), None, "wire {wire}: {reply}");
                let abort = end_transaction("abortTransaction", 2);
                let reply = other.command(abort).await.unwrap();
                assert_eq!(code(&reply), None, "{reply}");
            }
            assert!(lock.ddl_waits(), "wire {wire}: the drop still waits");
            lock.release().await;
            // A transaction holding `x` alone: a drop of `w` waits for it before 4.2 only.
            lock.server
                .handle()
                .insert("test.w", vec![doc! { "_id": 1 }]);
            let hold_x = doc! {
                "find": "x", "$db": "test", "lsid": lsid_of(3), "txnNumber": 1_i64,
                "autocommit": false, "startTransaction": true,
            };
            let reply = lock.client.command(hold_x).await.unwrap();
            assert_eq!(code(&reply), None, "{reply}");
            let drop_w = doc! { "drop": "w", "$db": "test", "maxTimeMS": 100 };
            let reply = lock.other.command(drop_w).await.unwrap();
            assert_eq!(
                code(&reply),
                before_4_2.then_some(50),
                "wire {wire}: {reply}"
            );
            lock.server.shutdown().await;
        }
    })
    .await
}

/// Docs13 (TK-15, house rule 7): before 5.0 a `listDatabases` without `nameOnly` takes each
/// database's IS lock to read its size (`list_databases.cpp`), so it queues behind a pending
/// `dropDatabase` of any database (50 at its `maxTimeMS`), on 4.0 as on 4.4; a filter on
/// `name` alone skips (and does not lock) the databases it rules out, and `nameOnly` locks
/// none; a filter on `name` that is not one leaf expression (`$ne`, `$nin`, a false `$exists`:
/// negations) locks every database (review18 finding 5). From 4.2 it also takes each
/// collection's IS lock (`sizeOnDiskForDb`), so it queues behind a `drop` pending on any
/// collection; before 4.2 that `drop` requests the database's X lock, so it queues there too
/// (review18 finding 6). 5.0 and later run it at once.
#[tokio::test]
async fn docs13_list_databases_queues_behind_pending_ddl_before_wire_13() {
    bounded(async {
        let list = |extra: Document| {
            let mut body = doc! { "listDatabases": 1, "$db": "admin", "maxTimeMS": 100 };
            body.extend(extra);
            body
        };
        // (wire, the pending DDL is a dropDatabase, listDatabases fields, queues)
        let cases = [
            (12, true, doc! {}, true),
            (7, true, doc! {}, true),
            (12, true, doc! { "nameOnly": true }, false),
            (12, true, doc! { "filter": { "name": "other" } }, false),
            (12, true, doc! { "filter": { "name": "test" } }, true),
            // Fixes18b (review18 finding 5): a negation is no leaf on `name` (the server's
            // parser makes it a NOT), so it locks every database, the ones it rules out too.
            (
                12,
                true,
                doc! { "filter": { "name": { "$ne": "test" } } },
                true,
            ),
            (
                12,
                true,
                doc! { "filter": { "name": { "$nin": ["test"] } } },
                true,
            ),
            (
                12,
                true,
                doc! { "filter": { "name": { "$exists": false } } },
                true,
            ),
            (
                12,
                true,
                doc! { "filter": { "name": { "$gt": "test" } } },
                false,
            ),
            (25, true, doc! {}, false),
            (12, false, doc! {}, true),
            (8, false, doc! {}, true),
            // Fixes18b (review18 finding 6): before 4.2 a collection's drop requests its
            // database's X lock, which the database's IS lock queues behind.
            // (Not on 3.6, wire 6: it has no transaction for the drop to wait for, fixes18c.)
            (7, false, doc! {}, true),
            (7, false, doc! { "filter": { "name": "other" } }, false),
        ];
        for (wire, drop_database, extra, queues) in cases {
            let mut lock = LockTest::on(start_primary_at(wire).await).await;
            lock.seed(&["test.w", "other.z"]);
            if drop_database {
                lock.pend(doc! { "dropDatabase": 1, "$db": "test" }).await;
            } else {
                lock.pend_drop_of_w().await;
            }
            let other = &mut lock.other;
            let reply = other.command(list(extra.clone())).await.unwrap();
            let case = format!("wire {wire} dropDatabase {drop_database} {extra}");
            assert_eq!(code(&reply), queues.then_some(50), "{case}: {reply}");
            // The filter is parsed before any lock: a bad one fails at once.
            let reply = other.command(list(doc! { "filter": 5 })).await.unwrap();
            assert!(
                code(&reply).is_some_and(|c| c != 50),
                "{case}, a bad filter: {reply}"
            );
            lock.finish(&format!("{case}: the DDL still waits")).await;
        }
    })
    .await
}

/// Fixes18c (TX-1, TK-15, house rule 7): transactions need 4.0 (wire 7) on a replica set and
/// 4.2 (wire 8) behind a mongos. A 3.6 primary (wire 6) knows neither `commitTransaction` nor
/// `abortTransaction` (59), and its command parsers refuse `autocommit` / `startTransaction` as
/// unknown fields (40415 from the IDL write parsers, 9 from find's and aggregate's); a 4.0
/// mongos refuses either field on any command with 50841. A retryable write (a `txnNumber`
/// alone) still runs on both, and 4.0 primaries and 4.2 mongoses run the transaction.
#[tokio::test]
async fn fixes18c_tk15_transactions_need_wire_7_on_a_replica_set_and_8_on_mongos() {
    bounded(async {
        let session =
            |body: Document, txn: i64, start: bool| in_transaction(body, &lsid_of(7), txn, start);
        let insert = doc! { "insert": "c", "documents": [{ "_id": 1 }], "$db": "db" };
        let find = doc! { "find": "c", "$db": "db" };
        let aggregate = doc! { "aggregate": "c", "pipeline": [], "cursor": {}, "$db": "db" };
        let commit = doc! { "commitTransaction": 1, "$db": "admin" };
        let retryable = doc! { "insert": "c", "documents": [{ "_id": 2 }], "$db": "db",
        "lsid": lsid_of(7), "txnNumber": 9_i64 };

        let (server, mut client) = start_primary_at(6).await;
        for (body, expected) in [
            (session(insert.clone(), 1, true), 40415),
            (session(find.clone(), 2, true), 9),
            (session(aggregate.clone(), 3, false), 9),
            (session(commit.clone(), 1, false), 59),
        ] {
            let reply = client.command(body.clone()).await.unwrap();
            assert_eq!(code(&reply), Some(expected), "wire 6, {body}: {reply}");
        }
        let reply = client.command(retryable.clone()).await.unwrap();
        assert_eq!(reply.get_i32("n").ok(), Some(1), "wire 6: {reply}");
        server.shutdown().await;

        for wire in [7, 8] {
            let config = ServerConfig {
                max_wire_version: wire,
                ..ServerConfig::new(retry_testkit::Role::Mongos)
            };
            let server = TestServer::start(config).await.expect("server starts");
            let mut client = RawClient::connect(server.address()).await.unwrap();
            let mut start_only = session(find.clone(), 4, true);
            start_only.remove("autocommit");
            // On 4.2: the third continues the second's transaction, and the fourth lacks
            // `autocommit` (50768: a `txnNumber` on a read).
            for (body, at_4_2) in [
                (session(insert.clone(), 1, true), None),
                (session(find.clone(), 2, true), None),
                (session(find.clone(), 2, false), None),
                (start_only, Some(50768)),
            ] {
                let reply = client.command(body.clone()).await.unwrap();
                let expected = if wire == 7 { Some(50841) } else { at_4_2 };
                assert_eq!(code(&reply), expected, "wire {wire}, {body}: {reply}");
            }
            let reply = client.command(retryable.clone()).await.unwrap();
            assert_eq!(reply.get_i32("n").ok(), Some(1), "wire {wire}: {reply}");
            server.shutdown().await;
        }

        let (server, mut client) = start_primary_at(7).await;
        let reply = client.command(session(insert, 1, true)).await.unwrap();
        assert_eq!(code(&reply), None, "wire 7 primary: {reply}");
        let reply = client.command(session(commit, 1, false)).await.unwrap();
        assert_eq!(code(&reply), None, "wire 7 primary: {reply}");
        server.shutdown().await;
    })
    .await
}

/// Review21 R6 (house rule 7, 11): `aggregate` refuses what a real server refuses when it
/// parses the pipeline, before anything runs: a `pipeline` that is no array or holds a
/// non-document (TypeMismatch 14), a stage document with other than one field
/// (40323, `LiteParsedDocumentSource::parse`), a `$limit` that is not a positive number and a
/// `$skip` that is negative or not a number (15957 / 15958 / 15956 / 15972 before 5.0;
/// 5107201 / 5107200, and 15958 for a `$limit` of 0, from 5.0), also in `{aggregate: 1}`
/// (parsed before the InvalidNamespace 73 check).
#[tokio::test]
async fn review21_r6_aggregate_refuses_malformed_stages_before_running_them() {
    bounded(async {
        for (wire, negative_skip, text_limit) in [(9, 15956, 15957), (25, 5107200, 5107201)] {
            let (server, mut client) = start_primary_at(wire).await;
            server
                .handle()
                .insert("db.c", vec![doc! { "_id": 1 }, doc! { "_id": 2 }]);
            let cases = [
                (bson!(5), 14),
                (bson!([{ "$limit": 1 }, 5]), 14),
                (bson!([{ "$match": {}, "$limit": 1 }, 5]), 14),
                (bson!([{ "$match": {}, "$limit": 1 }]), 40323),
                (bson!([{ "$limit": 1 }, {}]), 40323),
                (bson!([{ "$limit": 0 }]), 15958),
                (bson!([{ "$match": {} }, { "$limit": 0 }]), 15958),
                (bson!([{ "$limit": "1" }]), text_limit),
                (bson!([{ "$skip": -1 }]), negative_skip),
                (
                    bson!([{ "$sort": { "x": 1 } }, { "$skip": -1 }]),
                    negative_skip,
                ),
            ];
            for (pipeline, expected) in cases {
                for target in [Bson::from("c"), Bson::Int32(1)] {
                    let command = doc! {
                        "aggregate": target, "pipeline": pipeline.clone(), "cursor": {},
                        "$db": "db",
                    };
                    let reply = client.command(command.clone()).await.unwrap();
                    assert_eq!(
                        code(&reply),
                        Some(expected),
                        "wire {wire} {command}: {reply}"
                    );
                }
            }
            let valid = doc! {
                "aggregate": "c", "pipeline": [{ "$skip": 1 }, { "$limit": 1 }], "cursor": {},
                "$db": "db",
            };
            let reply = client.command(valid).await.unwrap();
            assert_eq!(first_batch(&reply), vec![doc! { "_id": 2 }], "{reply}");
            server.shutdown().await;
        }
    })
    .await
}

/// Review22 R1, R2, R3 (house rules 7 and 11): `aggregate` refuses an empty or non-document
/// `$project` / `$addFields`, a `$project` mixing inclusion and exclusion, and a missing
/// `pipeline` with the codes of the emulated server version (3.6 and 4.2:
/// `ParsedAggregationProjection`; 4.4+: `projection_parser.cpp`; 5.0+: the IDL parser and
/// `AddFieldsProjectionExecutor`), each reply carrying the `codeName` a real server gives
/// (`Location<code>` for an unnamed code). A dotted `$project` path, which the test server does
/// not project, is TestkitUnsupported rather than a wrong result. `$addFields: {}` runs (as a
/// no-op) from 5.0. Review23 R3: 4.0 (wire 7) is asserted too, and 4.4 (wire 9) refuses an empty
/// `$addFields` as the stored 4.4-era source does. Review23 R4: the messages before 4.4.
#[tokio::test]
async fn review22_r1_r3_aggregate_refuses_projections_and_pipelines_as_the_server_parses_them() {
    bounded(async {
        for wire in [6, 7, 8, 9, 13, 25] {
            let (server, mut client) = start_primary_at(wire).await;
            server.handle().insert(
                "db.c",
                vec![doc! { "_id": 1, "a": { "b": 1, "c": 2 }, "d": 3 }],
            );
            let ast = wire >= 9;
            let (empty_project, include_after, exclude_after) = if ast {
                (51272, 31253, 31254)
            } else {
                (40177, 40179, 40178)
            };
            // Review23 R3: 4.4 (wire 9) still refuses it, as the stored 4.4-era source does.
            let empty_add_fields = (wire < 13).then_some(40177);
            let missing_pipeline = if wire >= 13 { 40414 } else { 14 };
            // 3.6 and 4.0 (wires 6, 7) count a truthy `_id` as an included field; 4.2+ do not.
            let id_then_exclusion = (wire < 8).then_some(40178);
            let cases: Vec<(Document, Option<i32>)> = vec![
                (
                    doc! { "pipeline": [{ "$project": {} }] },
                    Some(empty_project),
                ),
                (doc! { "pipeline": [{ "$project": 1 }] }, Some(15969)),
                (
                    doc! { "pipeline": [{ "$addFields": {} }] },
                    empty_add_fields,
                ),
                (doc! { "pipeline": [{ "$addFields": "x" }] }, Some(40272)),
                (
                    doc! { "pipeline": [{ "$project": { "a": 1, "d": 0 } }] },
                    Some(exclude_after),
                ),
                (
                    doc! { "pipeline": [{ "$project": { "a": false, "d": true } }] },
                    Some(include_after),
                ),
                (
                    doc! { "pipeline": [{ "$project": { "_id": 1, "d": 0 } }] },
                    id_then_exclusion,
                ),
                (
                    doc! { "pipeline": [{ "$project": { "_id": 0, "d": 1 } }] },
                    None,
                ),
                (
                    doc! { "pipeline": [{ "$project": { "a.b": 1 } }] },
                    Some(TESTKIT_UNSUPPORTED),
                ),
                (
                    doc! { "pipeline": [{ "$project": { "a.b": 1 } }, { "$match": { "a.b": 1 } }] },
                    Some(TESTKIT_UNSUPPORTED),
                ),
                // The refusal comes as the stage is parsed, before an earlier stage runs.
                (
                    doc! { "pipeline": [{ "$match": { "_id": 1 } }, { "$project": {} }] },
                    Some(empty_project),
                ),
            ];
            for (fields, expected) in cases {
                let mut command = doc! { "aggregate": "c" };
                command.extend(fields);
                command.insert("cursor", doc! {});
                command.insert("$db", "db");
                let reply = client.command(command.clone()).await.unwrap();
                assert_eq!(code(&reply), expected, "wire {wire} {command}: {reply}");
                if let Some(expected) = expected.filter(|&c| c != TESTKIT_UNSUPPORTED) {
                    let name = format!("Location{expected}");
                    assert_eq!(
                        reply.get_str("codeName").ok(),
                        Some(name.as_str()),
                        "{reply}"
                    );
                }
            }
            // Review23 R4: before 4.4 the messages are the server's: the mix with no stage
            // context and its specification printed as `BSONObj::toString` prints it (keys
            // unquoted), the empty `$project` with the 3.x prefix or the 4.2 context.
            if !ast {
                let project = |spec: Document| {
                    doc! {
                        "aggregate": "c", "pipeline": [{ "$project": spec }], "cursor": {},
                        "$db": "db",
                    }
                };
                let reply = client
                    .command(project(doc! { "a": 1, "d": 0 }))
                    .await
                    .unwrap();
                assert_eq!(
                    reply.get_str("errmsg").ok(),
                    Some(
                        "Bad projection specification, cannot exclude fields other than '_id' \
                         in an inclusion projection: { a: 1, d: 0 }"
                    ),
                    "wire {wire}: {reply}"
                );
                let reply = client.command(project(doc! {})).await.unwrap();
                let empty = if wire < 8 {
                    "Invalid $project specification: specification must have at least one field"
                } else {
                    "Invalid $project :: caused by :: specification must have at least one field"
                };
                assert_eq!(
                    reply.get_str("errmsg").ok(),
                    Some(empty),
                    "wire {wire}: {reply}"
                );
            }
            // R3: the pipeline is parsed before `cursor` is looked for. Review23 R2: each reply
            // is named as that server names it; `error_codes.yml` names 40414 from 8.0 only.
            let missing_pipeline_name = match wire {
                25.. => "IDLFailedToParse",
                13.. => "Location40414",
                _ => "TypeMismatch",
            };
            for (command, expected, name) in [
                (
                    doc! { "aggregate": "c", "$db": "db" },
                    missing_pipeline,
                    missing_pipeline_name,
                ),
                (
                    doc! { "aggregate": "c", "pipeline": [5], "$db": "db" },
                    14,
                    "TypeMismatch",
                ),
                (
                    doc! { "aggregate": "c", "pipeline": [], "$db": "db" },
                    9,
                    "FailedToParse",
                ),
            ] {
                let reply = client.command(command.clone()).await.unwrap();
                assert_eq!(
                    code(&reply),
                    Some(expected),
                    "wire {wire} {command}: {reply}"
                );
                assert_eq!(
                    reply.get_str("codeName").ok(),
                    Some(name),
                    "wire {wire}: {reply}"
                );
            }
            // What is taken still runs.
            let command = doc! {
                "aggregate": "c", "pipeline": [{ "$project": { "_id": 0, "d": 1 } }],
                "cursor": {}, "$db": "db",
            };
            let reply = client.command(command).await.unwrap();
            assert_eq!(first_batch(&reply), vec![doc! { "d": 3 }], "{reply}");
            server.shutdown().await;
        }
    })
    .await
}
