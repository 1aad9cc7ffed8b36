//! Review32 R4, house rule 7: the database names and object sizes a real server refuses, the
//! test server refuses with the same codes and messages (see the crate's `database_name` and
//! `server/malformed` modules, and `store::insert_refusal`, for the server source each follows).
//! Bounded, on 127.0.0.1.

use std::future::Future;
use std::time::Duration;

use bson::{doc, Bson, Document};
use retry_core::wire::{HEADER_LEN, OP_MSG};
use retry_testkit::{FailCommand, FailPointMode, RawClient, Role, ServerConfig, TestServer};
use tokio::time::timeout;

/// `BSONObjMaxUserSize`, the hello's `maxBsonObjectSize`.
const MAX_USER_SIZE: usize = 16 * 1024 * 1024;
/// `BSONObjMaxInternalSize`: the largest document an OP_MSG section may hold.
const MAX_INTERNAL_SIZE: usize = MAX_USER_SIZE + 16 * 1024;

/// A frame of `body` and `sequences` (each document encoded as it is), request id 1.
fn frame_of(body: &Document, sequences: &[(&str, &[Document])]) -> Vec<u8> {
    let mut frame = vec![0; HEADER_LEN + 4];
    for (identifier, documents) in sequences {
        let mut section = identifier.as_bytes().to_vec();
        section.push(0);
        for document in *documents {
            section.extend(document.to_vec().unwrap());
        }
        frame.push(1);
        frame.extend(((section.len() + 4) as i32).to_le_bytes());
        frame.extend(section);
    }
    frame.push(0);
    frame.extend(body.to_vec().unwrap());
    let len = frame.len() as i32;
    frame[..4].copy_from_slice(&len.to_le_bytes());
    frame[4..8].copy_from_slice(&1_i32.to_le_bytes());
    frame[12..16].copy_from_slice(&OP_MSG.to_le_bytes());
    frame
}

/// `document` with a string field `pad` appended so that it encodes to exactly `size` bytes.
fn sized(document: Document, size: usize) -> Document {
    let mut padded = document.clone();
    padded.insert("pad", "");
    let overhead = padded.to_vec().unwrap().len();
    padded.insert("pad", "p".repeat(size - overhead));
    assert_eq!(padded.to_vec().unwrap().len(), size);
    padded
}

/// Sends `frame` and returns the reply's body.
async fn round_trip(client: &mut RawClient, frame: &[u8]) -> Document {
    client.send_raw(frame).await.unwrap();
    client.receive().await.unwrap().body
}

/// Sends `body` as it is, framed here (not through the codec, whose checks for what a client
/// may send are not under test), and returns the reply's body.
async fn run(client: &mut RawClient, body: Document) -> Document {
    round_trip(client, &frame_of(&body, &[])).await
}

/// Runs `test`, failing if it takes longer than `seconds` (every test here is bounded).
async fn bounded(seconds: u64, test: impl Future<Output = ()>) {
    timeout(Duration::from_secs(seconds), test)
        .await
        .expect("bounded");
}

/// A test server in `role` and a raw client connected to it.
async fn serve(role: Role) -> (TestServer, RawClient) {
    let server = TestServer::start(ServerConfig::new(role)).await.unwrap();
    let client = RawClient::connect(server.address()).await.unwrap();
    (server, client)
}

/// `frame` with the first key `sent` (its bytes, the NUL after it included) renamed to `as_key`
/// (as long): how a key is sent twice, which a `Document` cannot hold.
fn renamed(mut frame: Vec<u8>, sent: &[u8], as_key: &[u8]) -> Vec<u8> {
    assert_eq!(sent.len(), as_key.len());
    let at = frame
        .windows(sent.len())
        .position(|w| w == sent)
        .expect("the key to rename");
    frame[at..at + sent.len()].copy_from_slice(as_key);
    frame
}

/// The write errors of `reply`, as (index, code, message).
fn write_errors(reply: &Document) -> Vec<(i32, i32, String)> {
    reply
        .get_array("writeErrors")
        .map(|errors| {
            errors
                .iter()
                .filter_map(Bson::as_document)
                .map(|e| {
                    (
                        e.get_i32("index").unwrap(),
                        code(e).unwrap(),
                        errmsg(e).to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The op results of a `bulkWrite` reply (its cursor's first batch).
fn bulk_results(reply: &Document) -> Vec<Document> {
    let results = reply
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
        .unwrap_or_else(|_| panic!("bulkWrite results: {reply:?}"));
    results
        .iter()
        .filter_map(Bson::as_document)
        .cloned()
        .collect()
}

fn code(reply: &Document) -> Option<i32> {
    reply.get_i32("code").ok()
}

fn errmsg(reply: &Document) -> &str {
    reply.get_str("errmsg").unwrap_or_default()
}

/// House rule 7 (review32 R4): a `$db` a real server refuses is InvalidNamespace (73) with the
/// server's message, on the raw path's commands (ping, hello) and the others, on a mongod and a
/// mongos, and nothing runs: the parse's refusals ('.', NUL, over 63 bytes) and `validDBName`'s
/// (empty, `/`, `\`, space, `"`). A 63-byte name runs, and a ping on `$external`; an unknown command is
/// CommandNotFound (59) whatever its `$db`, as the server looks it up first; a mongos refuses
/// `local` (IllegalOperation, 20), a mongod runs a ping on it.
#[tokio::test]
async fn invalid_database_names_are_invalid_namespace_house_rule_7() {
    bounded(60, async {
        let long = "d".repeat(64);
        let invalid = [
            ("", "Invalid database name: ''".to_owned()),
            ("a/b", "Invalid database name: 'a/b'".to_owned()),
            ("a\\b", "Invalid database name: 'a\\b'".to_owned()),
            ("a b", "Invalid database name: 'a b'".to_owned()),
            ("a\"b", "Invalid database name: 'a\"b'".to_owned()),
            (
                "te.st",
                "'.' is an invalid character in a db name: te.st".to_owned(),
            ),
            (
                "te\0st",
                "database names cannot have embedded null characters".to_owned(),
            ),
            (
                &long,
                "db name must be at most 63 characters, found: 64".to_owned(),
            ),
        ];
        for role in [Role::Standalone, Role::Mongos] {
            let router = role == Role::Mongos;
            let (server, mut client) = serve(role.clone()).await;
            let commands = [
                doc! { "ping": 1 },
                doc! { "hello": 1 },
                doc! { "isMaster": 1 },
                doc! { "find": "c", "filter": {} },
                doc! { "insert": "c", "documents": [{ "_id": 1 }] },
            ];
            for command in &commands {
                for (db, message) in &invalid {
                    let mut body = command.clone();
                    body.insert("$db", *db);
                    let reply = run(&mut client, body).await;
                    assert_eq!(code(&reply), Some(73), "{command} on {db:?}: {reply}");
                    assert_eq!(reply.get_str("codeName").ok(), Some("InvalidNamespace"));
                    assert_eq!(errmsg(&reply), message, "{command} on {db:?}");
                }
                for db in [&long[..63], "db"] {
                    let mut body = command.clone();
                    body.insert("$db", db);
                    let reply = run(&mut client, body).await;
                    assert_eq!(code(&reply), None, "{command} on {db:?}: {reply}");
                }
                let mut body = command.clone();
                body.insert("$db", "local");
                let reply = run(&mut client, body).await;
                let expected = router.then_some(20);
                assert_eq!(code(&reply), expected, "{command} on local: {reply}");
                if router {
                    assert_eq!(errmsg(&reply), "Can't use 'local' database through mongos");
                }
            }
            let ping = doc! { "ping": 1, "$db": "$external" };
            let reply = run(&mut client, ping).await;
            assert_eq!(code(&reply), None, "ping on $external: {reply}");
            for (db, _) in &invalid {
                let reply = run(&mut client, doc! { "nope": 1, "$db": *db }).await;
                assert_eq!(code(&reply), Some(59), "nope on {db:?}: {reply}");
            }
            let inserts = server.handle().counters().command("insert");
            // One insert ran per accepted database (the 63-byte name, `db`, and `local` on the
            // mongod).
            let ran = if router { 2 } else { 3 };
            assert_eq!(
                inserts.executed, ran,
                "{role:?}: only the valid inserts ran"
            );
            assert!(server.handle().documents("te.st.c").is_empty());
            server.shutdown().await;
        }
    })
    .await;
}

/// House rule 7 (review32 R4): the server evaluates the `failCommand` fail point after it parsed
/// the command's database name and before `validDBName`: a name the parse refuses ('.') never
/// fires the fail point, an empty one fires it, and once it is spent the empty name is refused.
#[tokio::test]
async fn the_fail_point_fires_between_the_two_database_name_checks_house_rule_7() {
    bounded(30, async {
        let (server, mut client) = serve(Role::Standalone).await;
        let handle = server.handle();
        handle.set_fail_command(Some(
            FailCommand::new(FailPointMode::Times(1), ["find"]).with_error_code(91),
        ));
        let find = |db: &str| doc! { "find": "c", "$db": db };
        let parsed = run(&mut client, find("te.st")).await;
        assert_eq!(code(&parsed), Some(73), "{parsed}");
        assert_eq!(handle.counters().fail_points_triggered, 0);
        let fired = run(&mut client, find("")).await;
        assert_eq!(code(&fired), Some(91), "{fired}");
        assert_eq!(handle.counters().fail_points_triggered, 1);
        let refused = run(&mut client, find("")).await;
        assert_eq!(code(&refused), Some(73), "{refused}");
        assert_eq!(errmsg(&refused), "Invalid database name: ''");
        assert_eq!(handle.counters().command("find").executed, 0);
        server.shutdown().await;
    })
    .await;
}

/// House rule 7 (review32 R4), MO-8: an awaitable hello on a database a server refuses is
/// refused at once, not awaited.
#[tokio::test]
async fn an_awaitable_hello_on_an_invalid_database_is_refused_at_once_house_rule_7() {
    bounded(30, async {
        let (server, mut client) = serve(Role::Standalone).await;
        let first = run(&mut client, doc! { "hello": 1, "$db": "admin" }).await;
        let version = first.get_document("topologyVersion").unwrap().clone();
        for db in ["", "te.st"] {
            let awaitable = doc! {
                "hello": 1, "topologyVersion": version.clone(), "maxAwaitTimeMS": 60_000_i64,
                "$db": db,
            };
            let reply = timeout(Duration::from_secs(5), run(&mut client, awaitable))
                .await
                .expect("refused at once, not awaited");
            assert_eq!(code(&reply), Some(73), "{db:?}: {reply}");
        }
        server.shutdown().await;
    })
    .await;
}

/// House rule 7 (review32 R4): a body or a document-sequence document over
/// `BSONObjMaxInternalSize` (16 MiB + 16 KiB) is BSONObjectTooLarge (10334) with the server's
/// message, before `$db` is read, on the raw path's ping as on an insert; the connection stays
/// open and nothing runs. A body of exactly that size runs.
#[tokio::test]
async fn documents_over_the_internal_size_are_bson_object_too_large_house_rule_7() {
    bounded(120, async {
        let (server, mut client) = serve(Role::Standalone).await;
        let over = MAX_INTERNAL_SIZE + 1;
        let insert = doc! { "insert": "c", "$db": "db" };
        let small = [doc! { "_id": 1 }];
        let big = [doc! { "_id": 2 }, sized(doc! { "_id": 3 }, over)];
        let cases = [
            (
                "ping over",
                frame_of(&sized(doc! { "ping": 1, "$db": "admin" }, over), &[]),
                Some(10334),
            ),
            (
                "ping without $db over",
                frame_of(&sized(doc! { "ping": 1 }, over), &[]),
                Some(10334),
            ),
            (
                "insert body over",
                frame_of(
                    &sized(
                        doc! { "insert": "c", "documents": [{ "_id": 4 }], "$db": "db" },
                        over,
                    ),
                    &[],
                ),
                Some(10334),
            ),
            (
                "insert sequence document over",
                frame_of(&insert, &[("documents", &big)]),
                Some(10334),
            ),
            (
                "ping at the limit",
                frame_of(
                    &sized(doc! { "ping": 1, "$db": "admin" }, MAX_INTERNAL_SIZE),
                    &[],
                ),
                None,
            ),
            (
                "insert of a small document after the refusals",
                frame_of(&insert, &[("documents", &small)]),
                None,
            ),
        ];
        for (label, frame, expected) in cases {
            let reply = round_trip(&mut client, &frame).await;
            assert_eq!(code(&reply), expected, "{label}: {}", errmsg(&reply));
            if expected.is_some() {
                assert_eq!(reply.get_str("codeName").ok(), Some("BSONObjectTooLarge"));
                let prefix = format!(
                    "BSONObj size: {over} (0x{over:X}) is invalid. Size must be between 0 and \
                     16793600(16MB)"
                );
                assert!(
                    errmsg(&reply).starts_with(&prefix),
                    "{label}: {}",
                    errmsg(&reply)
                );
            }
        }
        let body = frame_of(
            &sized(
                doc! { "insert": "c", "documents": [{ "_id": 4 }], "$db": "db" },
                over,
            ),
            &[],
        );
        let reply = round_trip(&mut client, &body).await;
        assert!(
            errmsg(&reply).ends_with(" First element: insert: \"c\""),
            "{}",
            errmsg(&reply)
        );
        assert_eq!(server.handle().documents("db.c"), small.to_vec());
        server.shutdown().await;
    })
    .await;
}

/// House rule 7 (review32 R4), TK-4: an inserted document over `maxBsonObjectSize` (16 MiB) that
/// an OP_MSG section can still carry is the statement's write error, BadValue (2), "object to
/// insert too large. size in bytes: N, max size: 16777216": an ordered insert stops there, an
/// unordered one goes on; a bulkWrite insert op gets the same error; a document of exactly
/// 16 MiB is inserted.
#[tokio::test]
async fn an_inserted_document_over_max_bson_object_size_is_a_write_error_tk4_house_rule_7() {
    bounded(120, async {
        let (server, mut client) = serve(Role::Standalone).await;
        let over = MAX_USER_SIZE + 1;
        let message =
            format!("object to insert too large. size in bytes: {over}, max size: 16777216");
        for (ordered, n) in [(true, 1), (false, 2)] {
            let collection = if ordered { "ordered" } else { "unordered" };
            let insert = doc! { "insert": collection, "ordered": ordered, "$db": "db" };
            let documents = [
                doc! { "_id": 1 },
                sized(doc! { "_id": 2 }, over),
                doc! { "_id": 3 },
            ];
            let reply = round_trip(
                &mut client,
                &frame_of(&insert, &[("documents", &documents)]),
            )
            .await;
            assert_eq!(reply.get_i32("n").ok(), Some(n), "{reply:?}");
            assert_eq!(write_errors(&reply), vec![(1, 2, message.clone())]);
        }
        let at_limit = [sized(doc! { "_id": 4 }, MAX_USER_SIZE)];
        let insert = doc! { "insert": "c", "$db": "db" };
        let reply = round_trip(&mut client, &frame_of(&insert, &[("documents", &at_limit)])).await;
        assert_eq!(
            reply.get_i32("n").ok(),
            Some(1),
            "at the limit: {}",
            errmsg(&reply)
        );
        assert!(reply.get("writeErrors").is_none());

        let bulk = doc! {
            "bulkWrite": 1, "nsInfo": [{ "ns": "db.bulk" }], "$db": "admin",
        };
        let ops = [doc! { "insert": 0, "document": sized(doc! { "_id": 5 }, over) }];
        let reply = round_trip(&mut client, &frame_of(&bulk, &[("ops", &ops)])).await;
        assert_eq!(reply.get_i32("nErrors").ok(), Some(1), "{}", errmsg(&reply));
        let result = &bulk_results(&reply)[0];
        assert_eq!(code(result), Some(2), "{result:?}");
        assert_eq!(result.get_str("codeName").ok(), Some("BadValue"));
        assert_eq!(errmsg(result), message);
        assert!(server.handle().documents("db.bulk").is_empty());
        server.shutdown().await;
    })
    .await;
}

/// House rule 7 (review34 Y8), TK-4: an inserted document is measured as it was sent, as the
/// server's `objsize()` is: one over `maxBsonObjectSize` with a key sent twice is refused
/// (BadValue, 2, its size as sent), though the document it converts to (the key once, with its
/// last value) is small.
#[tokio::test]
async fn an_inserted_document_is_measured_as_sent_tk4_house_rule_7() {
    bounded(120, async {
        let (server, mut client) = serve(Role::Standalone).await;
        let over = MAX_USER_SIZE + 1;
        let mut document = doc! { "_id": 6, "pada": "", "padb": "x" };
        let overhead = document.to_vec().unwrap().len();
        document.insert("pada", "p".repeat(over - overhead));
        assert_eq!(document.to_vec().unwrap().len(), over);
        let insert = doc! { "insert": "c", "$db": "db" };
        // `padb` is sent as `pada`: the key twice.
        let frame = renamed(
            frame_of(&insert, &[("documents", &[document])]),
            b"padb\0",
            b"pada\0",
        );
        let reply = round_trip(&mut client, &frame).await;
        assert_eq!(reply.get_i32("n").ok(), Some(0), "{reply:?}");
        let message =
            format!("object to insert too large. size in bytes: {over}, max size: 16777216");
        assert_eq!(write_errors(&reply), vec![(0, 2, message)]);
        assert!(server.handle().documents("db.c").is_empty());
        server.shutdown().await;
    })
    .await;
}

/// House rule 7 (review34 Y4), TK-14: every write to a database whose name holds `$`, and
/// `create`, is InvalidNamespace (73), "Invalid namespace: <ns>", the command's error (a
/// `bulkWrite` op's error), on a mongod and a mongos, and nothing is written; a read there runs.
#[tokio::test]
async fn writes_to_a_database_named_with_a_dollar_are_invalid_namespace_house_rule_7() {
    bounded(60, async {
        for role in [Role::Standalone, Role::Mongos] {
            let (server, mut client) = serve(role.clone()).await;
            let writes = [
                doc! { "insert": "c", "documents": [{ "_id": 1 }], "$db": "a$b" },
                doc! { "update": "c", "updates": [{ "q": {}, "u": { "$set": { "x": 1 } },
                "upsert": true }], "$db": "a$b" },
                doc! { "delete": "c", "deletes": [{ "q": {}, "limit": 0 }], "$db": "a$b" },
                doc! { "findAndModify": "c", "query": {}, "update": { "$set": { "x": 1 } },
                "upsert": true, "$db": "a$b" },
                doc! { "create": "c", "$db": "a$b" },
                doc! { "createIndexes": "c", "indexes": [{ "key": { "x": 1 }, "name": "x_1" }],
                "$db": "a$b" },
            ];
            for write in writes {
                let reply = run(&mut client, write.clone()).await;
                assert_eq!(code(&reply), Some(73), "{role:?} {write:?}: {reply:?}");
                assert_eq!(errmsg(&reply), "Invalid namespace: a$b.c");
            }
            let bulk = doc! {
                "bulkWrite": 1, "ops": [{ "insert": 0, "document": { "_id": 1 } }],
                "nsInfo": [{ "ns": "a$b.c" }], "$db": "admin",
            };
            let reply = run(&mut client, bulk).await;
            assert_eq!(reply.get_i32("nErrors").ok(), Some(1), "{reply:?}");
            let find = run(&mut client, doc! { "find": "c", "$db": "a$b" }).await;
            assert_eq!(code(&find), None, "{find:?}");
            assert!(server.handle().documents("a$b.c").is_empty());
            server.shutdown().await;
        }
    })
    .await;
}

/// House rule 7 (review34 Y4), TK-14: a mongod refuses to create a database that differs only
/// in case from one it has, `admin` and `local` included (DatabaseDifferCase, 13297): a write
/// error for each document an insert would store (an ordered one stops at the first) and for an
/// upsert, the command's error for `create`, `createIndexes` and an upserting `findAndModify`.
/// Reads, an update without upsert and a delete create nothing and run; once the other database
/// is dropped, the name is free.
#[tokio::test]
async fn a_mongod_refuses_a_database_differing_only_in_case_house_rule_7() {
    bounded(60, async {
        let (server, mut client) = serve(Role::Standalone).await;
        let insert = |db: &str, ordered: bool| {
            doc! { "insert": "c", "documents": [{ "_id": 1 }, { "_id": 2 }], "ordered": ordered,
            "$db": db }
        };
        let reply = run(&mut client, insert("test", true)).await;
        assert_eq!(reply.get_i32("n").ok(), Some(2), "{reply:?}");
        let message = "db already exists with different case already have: [test] trying to \
                       create [Test]";
        let reply = run(&mut client, insert("Test", true)).await;
        assert_eq!(reply.get_i32("n").ok(), Some(0), "{reply:?}");
        assert_eq!(write_errors(&reply), vec![(0, 13297, message.to_owned())]);
        let reply = run(&mut client, insert("Test", false)).await;
        assert_eq!(
            write_errors(&reply),
            vec![
                (0, 13297, message.to_owned()),
                (1, 13297, message.to_owned())
            ]
        );
        let upsert = doc! { "update": "c", "updates": [{ "q": { "_id": 3 },
        "u": { "$set": { "x": 1 } }, "upsert": true }], "$db": "Test" };
        let reply = run(&mut client, upsert).await;
        assert_eq!(write_errors(&reply), vec![(0, 13297, message.to_owned())]);
        for command in [
            doc! { "create": "c", "$db": "Test" },
            doc! { "createIndexes": "c", "indexes": [{ "key": { "x": 1 }, "name": "x_1" }],
            "$db": "Test" },
            doc! { "findAndModify": "c", "query": {}, "update": { "$set": { "x": 1 } },
            "upsert": true, "$db": "Test" },
        ] {
            let reply = run(&mut client, command.clone()).await;
            assert_eq!(code(&reply), Some(13297), "{command:?}: {reply:?}");
            assert_eq!(errmsg(&reply), message);
        }
        for command in [
            doc! { "find": "c", "$db": "Test" },
            doc! { "update": "c", "updates": [{ "q": {}, "u": { "$set": { "x": 1 } } }],
            "$db": "Test" },
            doc! { "delete": "c", "deletes": [{ "q": {}, "limit": 0 }], "$db": "Test" },
        ] {
            let reply = run(&mut client, command.clone()).await;
            assert_eq!(code(&reply), None, "{command:?}: {reply:?}");
            assert!(write_errors(&reply).is_empty(), "{reply:?}");
        }
        for (db, have) in [("Admin", "admin"), ("LOCAL", "local")] {
            let reply = run(&mut client, insert(db, true)).await;
            let message = format!(
                "db already exists with different case already have: [{have}] trying to create \
                 [{db}]"
            );
            assert_eq!(write_errors(&reply), vec![(0, 13297, message)]);
        }
        assert!(server.handle().documents("Test.c").is_empty());
        let dropped = run(&mut client, doc! { "dropDatabase": 1, "$db": "test" }).await;
        assert_eq!(code(&dropped), None, "{dropped:?}");
        let reply = run(&mut client, insert("Test", true)).await;
        assert_eq!(reply.get_i32("n").ok(), Some(2), "{reply:?}");
        server.shutdown().await;
    })
    .await;
}

/// House rule 7 (review34 Y4), TK-14: a router creates a database on the first write to it,
/// whatever the write: `admin`, `local` or `config` in another case is InvalidOptions (72),
/// "Cannot manually create database '<db>'", and a name differing only in case from a database
/// it has is DatabaseDifferCase (13297) with the config server's message, the command's error; a
/// new name runs.
#[tokio::test]
async fn a_router_refuses_the_databases_it_may_not_create_house_rule_7() {
    bounded(60, async {
        let (server, mut client) = serve(Role::Mongos).await;
        let insert = |db: &str| doc! { "insert": "c", "documents": [{ "_id": 1 }], "$db": db };
        for db in ["Admin", "LOCAL", "Config"] {
            let reply = run(&mut client, insert(db)).await;
            assert_eq!(code(&reply), Some(72), "{db}: {reply:?}");
            assert_eq!(
                errmsg(&reply),
                format!("Cannot manually create database '{db}'")
            );
        }
        let reply = run(&mut client, insert("test")).await;
        assert_eq!(reply.get_i32("n").ok(), Some(1), "{reply:?}");
        let message =
            "can't have 2 databases that just differ on case  have: test want to add: Test";
        for command in [
            insert("Test"),
            doc! { "delete": "c", "deletes": [{ "q": {}, "limit": 0 }], "$db": "Test" },
            doc! { "create": "c", "$db": "Test" },
        ] {
            let reply = run(&mut client, command.clone()).await;
            assert_eq!(code(&reply), Some(13297), "{command:?}: {reply:?}");
            assert_eq!(errmsg(&reply), message);
        }
        let reply = run(&mut client, insert("fresh")).await;
        assert_eq!(reply.get_i32("n").ok(), Some(1), "{reply:?}");
        server.shutdown().await;
    })
    .await;
}

/// House rule 7 (review34 Y8), TK-4: an inserted document holding `_id` twice as sent (which its
/// conversion to a document would collapse) is its statement's write error, BadValue (2), "can't
/// have multiple _id fields in one document", in an `insert` and a `bulkWrite` insert op alike;
/// nothing is stored.
#[tokio::test]
async fn an_inserted_document_with_id_twice_is_a_write_error_tk4_house_rule_7() {
    bounded(60, async {
        let (server, mut client) = serve(Role::Standalone).await;
        let message = "can't have multiple _id fields in one document";
        // `_iX` is sent as `_id`.
        let as_sent = |frame: Vec<u8>| renamed(frame, b"_iX\0", b"_id\0");
        let documents = [doc! { "_id": 1, "_iX": 2 }];
        let insert = doc! { "insert": "c", "$db": "db" };
        let reply = round_trip(
            &mut client,
            &as_sent(frame_of(&insert, &[("documents", &documents)])),
        )
        .await;
        assert_eq!(reply.get_i32("n").ok(), Some(0), "{reply:?}");
        assert_eq!(write_errors(&reply), vec![(0, 2, message.to_owned())]);
        let bulk = doc! { "bulkWrite": 1, "nsInfo": [{ "ns": "db.c" }], "$db": "admin" };
        let ops = [doc! { "insert": 0, "document": { "_id": 1, "_iX": 2 } }];
        let reply = round_trip(&mut client, &as_sent(frame_of(&bulk, &[("ops", &ops)]))).await;
        assert_eq!(reply.get_i32("nErrors").ok(), Some(1), "{reply:?}");
        let result = &bulk_results(&reply)[0];
        assert_eq!(code(result), Some(2), "{result:?}");
        assert_eq!(errmsg(result), message);
        assert!(server.handle().documents("db.c").is_empty());
        server.shutdown().await;
    })
    .await;
}

/// Review36 V3 (house rule 7), TK-14: a mongod keeps a database it opened until
/// `dropDatabase`: `DatabaseHolderImpl::openDb` puts it in its map, and only `dropDb` (through
/// `close`) takes it out (`src/mongo/db/catalog/database_holder_impl.cpp`), so once the last
/// collection of `test` is dropped, creating `Test` is still DatabaseDifferCase (13297), and
/// `Config` too (a mongod always has `config`); after `dropDatabase` on `test`, `Test` is
/// created.
#[tokio::test]
async fn a_mongod_keeps_a_database_until_drop_database_review36_v3_house_rule_7() {
    bounded(60, async {
        let (server, mut client) = serve(Role::Standalone).await;
        let insert = |db: &str| doc! { "insert": "c", "documents": [{ "_id": 1 }], "$db": db };
        let reply = run(&mut client, insert("test")).await;
        assert_eq!(reply.get_i32("n").ok(), Some(1), "{reply:?}");
        let dropped = run(&mut client, doc! { "drop": "c", "$db": "test" }).await;
        assert_eq!(code(&dropped), None, "{dropped:?}");
        let names = run(
            &mut client,
            doc! { "listDatabases": 1, "nameOnly": true, "$db": "admin" },
        )
        .await;
        assert!(!format!("{names:?}").contains("\"test\""), "{names:?}");
        let message = "db already exists with different case already have: [test] trying to \
                       create [Test]";
        let reply = run(&mut client, insert("Test")).await;
        assert_eq!(write_errors(&reply), vec![(0, 13297, message.to_owned())]);
        let reply = run(&mut client, doc! { "create": "c", "$db": "Test" }).await;
        assert_eq!(code(&reply), Some(13297), "{reply:?}");
        let reply = run(&mut client, insert("Config")).await;
        let message = "db already exists with different case already have: [config] trying to \
                       create [Config]";
        assert_eq!(write_errors(&reply), vec![(0, 13297, message.to_owned())]);
        let dropped = run(&mut client, doc! { "dropDatabase": 1, "$db": "test" }).await;
        assert_eq!(code(&dropped), None, "{dropped:?}");
        let reply = run(&mut client, insert("Test")).await;
        assert_eq!(reply.get_i32("n").ok(), Some(1), "{reply:?}");
        server.shutdown().await;
    })
    .await;
}

/// Review36 V3 (house rule 7), TK-14: a router records a database on every write to it, one
/// that creates nothing included (its write targeter calls `cluster::createDatabase`, and the
/// config server keeps the `config.databases` entry until `dropDatabase`): after a delete on
/// `test`, or after `test`'s last collection is dropped, creating `Test` is DatabaseDifferCase
/// (13297); after `dropDatabase` on `test` it is created.
#[tokio::test]
async fn a_router_records_a_database_on_any_write_review36_v3_house_rule_7() {
    bounded(60, async {
        let (server, mut client) = serve(Role::Mongos).await;
        let message =
            "can't have 2 databases that just differ on case  have: test want to add: Test";
        let insert = |db: &str| doc! { "insert": "c", "documents": [{ "_id": 1 }], "$db": db };
        let delete = doc! { "delete": "c", "deletes": [{ "q": {}, "limit": 0 }], "$db": "test" };
        let reply = run(&mut client, delete).await;
        assert_eq!(reply.get_i32("n").ok(), Some(0), "{reply:?}");
        assert!(server.handle().documents("test.c").is_empty());
        let reply = run(&mut client, insert("Test")).await;
        assert_eq!(code(&reply), Some(13297), "{reply:?}");
        assert_eq!(errmsg(&reply), message);
        let reply = run(&mut client, insert("test")).await;
        assert_eq!(reply.get_i32("n").ok(), Some(1), "{reply:?}");
        let dropped = run(&mut client, doc! { "drop": "c", "$db": "test" }).await;
        assert_eq!(code(&dropped), None, "{dropped:?}");
        let reply = run(&mut client, doc! { "create": "c", "$db": "Test" }).await;
        assert_eq!(code(&reply), Some(13297), "{reply:?}");
        let dropped = run(&mut client, doc! { "dropDatabase": 1, "$db": "test" }).await;
        assert_eq!(code(&dropped), None, "{dropped:?}");
        let reply = run(&mut client, insert("Test")).await;
        assert_eq!(reply.get_i32("n").ok(), Some(1), "{reply:?}");
        server.shutdown().await;
    })
    .await;
}

/// A document nested `levels` deep (itself counting as one).
fn nested(levels: usize) -> Document {
    let mut document = doc! { "x": 1 };
    for _ in 1..levels {
        document = doc! { "x": document };
    }
    document
}

/// Review36 V6 (house rule 7), TK-4: an inserted document's problems are reported in the order
/// of the server's `fixDocumentForInsert` (`src/mongo/db/query/write_ops/insert.cpp`): its size
/// as sent, then its depth, then one pass over its elements, which checks each `_id` with
/// `validIdField` (`src/mongo/db/query/util/validate_id.cpp`: a regex, an array or undefined is
/// InvalidIdField 53, "The '_id' value cannot be of type <type>") before it asks whether an
/// `_id` came before (BadValue 2, "can't have multiple _id fields in one document"). All of
/// them come before the database's creation (DatabaseDifferCase 13297) and the duplicate key
/// check (11000).
#[tokio::test]
async fn the_errors_of_a_document_with_id_twice_come_in_the_servers_order_review36_v6() {
    bounded(120, async {
        let (server, mut client) = serve(Role::Standalone).await;
        let twice = "can't have multiple _id fields in one document".to_owned();
        let refused = |kind: &str| format!("The '_id' value cannot be of type {kind}");
        let regex = Bson::RegularExpression(bson::Regex {
            pattern: "a".try_into().unwrap(),
            options: "".try_into().unwrap(),
        });
        let over = MAX_USER_SIZE + 1;
        let deep = nested(100);
        let cases = [
            (
                "the second _id an array",
                doc! { "_id": 1, "_iX": [1] },
                "db",
                (53, refused("array")),
            ),
            (
                "the first _id a regex",
                doc! { "_id": regex.clone(), "_iX": 1 },
                "db",
                (53, refused("regex")),
            ),
            (
                "the second _id undefined",
                doc! { "_id": 1, "_iX": Bson::Undefined },
                "db",
                (53, refused("undefined")),
            ),
            (
                "a lone array _id",
                doc! { "_id": [1] },
                "db",
                (53, refused("array")),
            ),
            (
                "twice, the first _id stored",
                doc! { "_id": 1, "_iX": 2 },
                "db",
                (2, twice.clone()),
            ),
            (
                "twice, too deep",
                doc! { "_id": 9, "_iX": 2, "deep": deep },
                "db",
                (
                    15,
                    "cannot insert document because it exceeds 100 levels of nesting".to_owned(),
                ),
            ),
            (
                "twice, too large",
                sized(doc! { "_id": 9, "_iX": [1] }, over),
                "db",
                (
                    2,
                    format!(
                        "object to insert too large. size in bytes: {over}, max size: 16777216"
                    ),
                ),
            ),
            (
                "twice, in a database differing in case",
                doc! { "_id": 1, "_iX": 2 },
                "DB",
                (2, twice.clone()),
            ),
            (
                "an array _id, in a database differing in case",
                doc! { "_id": [1] },
                "DB",
                (53, refused("array")),
            ),
        ];
        let first = run(
            &mut client,
            doc! { "insert": "c", "documents": [{ "_id": 1 }], "$db": "db" },
        )
        .await;
        assert_eq!(first.get_i32("n").ok(), Some(1), "{first:?}");
        for (label, document, db, (code, message)) in cases {
            let insert = doc! { "insert": "c", "$db": db };
            let mut frame = frame_of(&insert, &[("documents", &[document])]);
            if frame.windows(4).any(|w| w == b"_iX\0") {
                frame = renamed(frame, b"_iX\0", b"_id\0");
            }
            let reply = round_trip(&mut client, &frame).await;
            assert_eq!(reply.get_i32("n").ok(), Some(0), "{label}: {reply:?}");
            assert_eq!(write_errors(&reply), vec![(0, code, message)], "{label}");
        }
        // A bulkWrite insert op checks its document the same way.
        let bulk = doc! { "bulkWrite": 1, "nsInfo": [{ "ns": "db.c" }], "$db": "admin" };
        let ops = [doc! { "insert": 0, "document": { "_id": 1, "_iX": [1] } }];
        let frame = renamed(frame_of(&bulk, &[("ops", &ops)]), b"_iX\0", b"_id\0");
        let reply = round_trip(&mut client, &frame).await;
        let result = &bulk_results(&reply)[0];
        assert_eq!(code(result), Some(53), "{result:?}");
        assert_eq!(result.get_str("codeName").ok(), Some("InvalidIdField"));
        assert_eq!(errmsg(result), refused("array"));
        assert_eq!(server.handle().documents("db.c"), vec![doc! { "_id": 1 }]);
        server.shutdown().await;
    })
    .await;
}
