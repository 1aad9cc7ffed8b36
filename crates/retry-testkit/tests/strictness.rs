//! Review37 W4–W11 (house rule 7): the test server refuses what a real server refuses about
//! getMore, readConcern, writeConcern, `$readPreference`, `startTransaction` and secondaries'
//! commands, with the real server's code, message and order of checks (each test names the
//! mongodb/mongo source it follows). Over a real connection on 127.0.0.1; every test is bounded.

use std::future::Future;
use std::time::Duration;

use bson::{doc, Bson, Document, Timestamp};
use retry_testkit::{RawClient, Role, ServerConfig, TestServer};

async fn bounded<F: Future<Output = ()>>(body: F) {
    tokio::time::timeout(Duration::from_secs(20), body)
        .await
        .expect("the test finished within its bound");
}

async fn start(role: Role) -> (TestServer, RawClient) {
    let server = TestServer::start(ServerConfig::new(role))
        .await
        .expect("server starts");
    let client = RawClient::connect(server.address()).await.unwrap();
    (server, client)
}

/// A one-member replica set's primary.
async fn start_primary() -> (TestServer, RawClient) {
    let server = TestServer::start_replica_set("rs0", 1, ServerConfig::default())
        .await
        .expect("replica set starts")
        .remove(0);
    let client = RawClient::connect(server.address()).await.unwrap();
    (server, client)
}

fn lsid() -> Document {
    doc! { "id": Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![7; 16] }) }
}

fn code(reply: &Document) -> Option<i32> {
    reply.get_i32("code").ok()
}

fn errmsg(reply: &Document) -> &str {
    reply.get_str("errmsg").unwrap_or_default()
}

/// A `find` of `test.c` with batch size 1: its open cursor's id.
async fn open_cursor(client: &mut RawClient) -> i64 {
    let find = doc! { "find": "c", "batchSize": 1, "$db": "test" };
    let reply = client.command(find).await.unwrap();
    let id = reply.get_document("cursor").and_then(|c| c.get_i64("id"));
    let id = id.unwrap_or_else(|_| panic!("a cursor: {reply}"));
    assert_ne!(id, 0, "{reply}");
    id
}

/// Review37 W5 (find/getMore spec: a getMore's `batchSize` is positive; mongodb/mongo
/// src/mongo/db/query/getmore_request.cpp, `GetMoreRequest::isValid`): a getMore's `batchSize`
/// of 0 or below is BadValue (2), checked before the cursor is looked up (an unknown id gets it
/// too). Review37 W4 (TO-13, CS-4; src/mongo/db/commands/getmore_cmd.cpp): `maxTimeMS` on a
/// getMore of a non-awaitData cursor is BadValue (2), checked once the cursor is found (an
/// unknown id is CursorNotFound, 43); the cursor stays open. A change stream's cursor
/// (tailable, awaitData) takes one.
#[tokio::test]
async fn w4_w5_a_get_more_takes_no_zero_batch_size_and_no_max_time_ms_on_a_plain_cursor() {
    bounded(async {
        let (server, mut client) = start_primary().await;
        let documents = (0..4).map(|i| doc! { "_id": i }).collect();
        server.handle().insert("test.c", documents);
        let id = open_cursor(&mut client).await;
        let get_more = |id: i64, extra: Document| {
            let mut command = doc! { "getMore": id, "collection": "c", "$db": "test" };
            command.extend(extra);
            command
        };
        for (size, shown) in [(Bson::Int32(0), "0"), (Bson::Int64(-1), "-1")] {
            for cursor in [id, id + 1000] {
                let reply = client
                    .command(get_more(cursor, doc! { "batchSize": size.clone() }))
                    .await
                    .unwrap();
                assert_eq!(code(&reply), Some(2), "{reply}");
                assert_eq!(
                    errmsg(&reply),
                    format!("Batch size for getMore must be positive, but received: {shown}")
                );
            }
        }
        let with_max_time = get_more(id, doc! { "maxTimeMS": 100 });
        let reply = client.command(with_max_time).await.unwrap();
        assert_eq!(code(&reply), Some(2), "{reply}");
        assert_eq!(
            errmsg(&reply),
            "cannot set maxTimeMS on getMore command for a non-awaitData cursor"
        );
        let unknown = get_more(id + 1000, doc! { "maxTimeMS": 100 });
        let reply = client.command(unknown).await.unwrap();
        assert_eq!(
            code(&reply),
            Some(43),
            "the cursor is looked up first: {reply}"
        );
        // The refused getMores left the cursor open: it still gives its next batch.
        let reply = client
            .command(get_more(id, doc! { "batchSize": 1 }))
            .await
            .unwrap();
        let batch = reply
            .get_document("cursor")
            .and_then(|c| c.get_array("nextBatch"));
        assert_eq!(batch.map(Vec::len).ok(), Some(1), "{reply}");

        let watch = doc! {
            "aggregate": "c", "pipeline": [{ "$changeStream": {} }], "cursor": {}, "$db": "test",
        };
        let reply = client.command(watch).await.unwrap();
        let stream = reply.get_document("cursor").and_then(|c| c.get_i64("id"));
        let stream = stream.unwrap_or_else(|_| panic!("a change stream: {reply}"));
        let reply = client
            .command(get_more(stream, doc! { "maxTimeMS": 10 }))
            .await
            .unwrap();
        assert_eq!(
            code(&reply),
            None,
            "an awaitData cursor takes maxTimeMS: {reply}"
        );
        server.shutdown().await;
    })
    .await;
}

/// Review37 W6 (SE-21; src/mongo/db/commands/getmore_cmd.cpp `allowsAfterClusterTime`,
/// src/mongo/db/read_concern_mongod.cpp): a getMore with `readConcern.afterClusterTime` is
/// InvalidOptions (72), "afterClusterTime is not allowed for this command", even at a time the
/// server has seen. Review37 W7 (read_concern_mongod.cpp): a standalone refuses any
/// `afterClusterTime` or `atClusterTime` with IllegalOperation (20); a replica-set member
/// takes the same read.
#[tokio::test]
async fn w6_w7_after_cluster_time_is_refused_on_get_more_and_on_a_standalone() {
    bounded(async {
        let (server, mut client) = start_primary().await;
        let documents = (0..3).map(|i| doc! { "_id": i }).collect();
        server.handle().insert("test.c", documents);
        let id = open_cursor(&mut client).await;
        let seen = Timestamp {
            time: 1,
            increment: 1,
        };
        let get_more = doc! {
            "getMore": id, "collection": "c", "$db": "test",
            "readConcern": { "afterClusterTime": seen },
        };
        let reply = client.command(get_more).await.unwrap();
        assert_eq!(code(&reply), Some(72), "{reply}");
        assert_eq!(
            errmsg(&reply),
            "afterClusterTime is not allowed for this command"
        );
        let find = doc! {
            "find": "c", "$db": "test", "readConcern": { "afterClusterTime": seen },
        };
        let reply = client.command(find.clone()).await.unwrap();
        assert_eq!(code(&reply), None, "a primary takes it: {reply}");
        server.shutdown().await;

        let (server, mut client) = start(Role::Standalone).await;
        let reply = client.command(find).await.unwrap();
        assert_eq!(code(&reply), Some(20), "{reply}");
        assert_eq!(
            errmsg(&reply),
            "Cannot specify afterClusterTime readConcern without replication enabled"
        );
        server.shutdown().await;
    })
    .await;
}

/// Review37 W8 (src/mongo/db/write_concern_options.cpp and write_concern_options_test.cpp,
/// src/mongo/db/write_concern.cpp): a command that takes a `writeConcern` parses it: `w` a
/// number or string, `j` / `fsync` numbers or booleans and not both true, no unknown field
/// (FailedToParse, 9); a standalone refuses `w` above 1 (BadValue, 2). A command that takes none
/// is refused first (72), whatever the document holds.
#[tokio::test]
async fn w8_a_write_concern_is_parsed_as_a_real_server_parses_it() {
    bounded(async {
        let (server, mut client) = start_primary().await;
        let insert = |id: i32, write_concern: Document| {
            doc! {
                "insert": "c", "documents": [{ "_id": id }], "$db": "test",
                "writeConcern": write_concern,
            }
        };
        let refused = [
            (doc! { "w": true }, "w has to be a number or a string"),
            (doc! { "w": {} }, "w has to be a number or a string"),
            (
                doc! { "journal": true },
                "unrecognized write concern field: journal",
            ),
            (
                doc! { "wtimeoutMS": 100 },
                "unrecognized write concern field: wtimeoutMS",
            ),
            (doc! { "j": "yes" }, "j must be numeric or a boolean value"),
            (
                doc! { "fsync": "yes" },
                "fsync must be numeric or a boolean value",
            ),
            (
                doc! { "j": true, "fsync": true },
                "fsync and j options cannot be used together",
            ),
        ];
        for (write_concern, message) in refused {
            let reply = client
                .command(insert(1, write_concern.clone()))
                .await
                .unwrap();
            assert_eq!(code(&reply), Some(9), "{write_concern}: {reply}");
            assert_eq!(errmsg(&reply), message);
        }
        assert!(server.handle().documents("test.c").is_empty(), "none ran");
        let accepted = [
            doc! { "w": "majority", "wtimeout": 100, "j": true },
            doc! { "w": 1, "fsync": false },
            doc! {},
        ];
        for (id, write_concern) in accepted.into_iter().enumerate() {
            let reply = client
                .command(insert(id as i32, write_concern.clone()))
                .await
                .unwrap();
            assert_eq!(code(&reply), None, "{write_concern}: {reply}");
        }
        let find = doc! { "find": "c", "$db": "test", "writeConcern": { "w": true } };
        let reply = client.command(find).await.unwrap();
        assert_eq!(code(&reply), Some(72), "does not take one, first: {reply}");
        server.shutdown().await;

        let (server, mut client) = start(Role::Standalone).await;
        let reply = client.command(insert(1, doc! { "w": 2 })).await.unwrap();
        assert_eq!(code(&reply), Some(2), "{reply}");
        assert_eq!(
            errmsg(&reply),
            "cannot use 'w' > 1 when a host is not replicated"
        );
        for write_concern in [doc! { "w": 1 }, doc! { "w": "majority" }] {
            let reply = client.command(insert(2, write_concern)).await.unwrap();
            assert_eq!(code(&reply), None, "{reply}");
        }
        server.shutdown().await;
    })
    .await;
}

/// Review37 W9 (SS-2, SS-9; src/mongo/client/read_preference.cpp
/// `ReadPreferenceSetting::fromInnerBSON`): tags other than `[]` / `[{}]` with "primary" and a
/// `maxStalenessSeconds` with "primary" are BadValue (2); a negative `maxStalenessSeconds` is
/// BadValue (2), one below 90 MaxStalenessOutOfRange (160); `tags` not an array and
/// `maxStalenessSeconds` not a number are TypeMismatch (14).
#[tokio::test]
async fn w9_a_read_preference_is_validated_beyond_its_mode() {
    bounded(async {
        let (server, mut client) = start(Role::Mongos).await;
        let find = |preference: Document| {
            doc! { "find": "c", "$db": "test", "$readPreference": preference }
        };
        let cases = [
            (
                doc! { "mode": "primary", "tags": [{ "dc": "ny" }] },
                Some(2),
                "Only empty tags are allowed with primary read preference",
            ),
            (
                doc! { "mode": "primary", "maxStalenessSeconds": 120 },
                Some(2),
                "maxStalenessSeconds can not be set for the primary mode",
            ),
            (
                doc! { "mode": "secondary", "maxStalenessSeconds": -5 },
                Some(2),
                "maxStalenessSeconds must be a non-negative integer",
            ),
            (
                doc! { "mode": "nearest", "maxStalenessSeconds": 10 },
                Some(160),
                "maxStalenessSeconds value can not be less than 90",
            ),
            (
                doc! { "mode": "nearest", "tags": "dc" },
                Some(14),
                "\"tags\" had the wrong type. Expected array, found string",
            ),
            (
                doc! { "mode": "nearest", "maxStalenessSeconds": "90" },
                Some(14),
                "",
            ),
            (doc! { "mode": "primary", "tags": [{}] }, None, ""),
            (doc! { "mode": "primary", "tags": [] }, None, ""),
            (doc! { "mode": "primary", "maxStalenessSeconds": 0 }, None, ""),
            (
                doc! { "mode": "secondaryPreferred", "tags": [{ "dc": "ny" }, {}], "maxStalenessSeconds": 90 },
                None,
                "",
            ),
        ];
        for (preference, expected, message) in cases {
            let reply = client.command(find(preference.clone())).await.unwrap();
            assert_eq!(code(&reply), expected, "{preference}: {reply}");
            if !message.is_empty() {
                assert_eq!(errmsg(&reply), message);
            }
        }
        server.shutdown().await;
    })
    .await;
}

/// Review37 W10 (TX-1, TX-7): a `startTransaction` at the session's active transaction number
/// is ConflictingOperationInProgress (117) without `TransientTransactionError`: on a replica-set
/// member (src/mongo/db/transaction/transaction_participant.cpp: only a shard server may restart
/// at the active number) and on a mongos (src/mongo/s/transaction_router.cpp: "already
/// started"), for a transaction in progress, committed, or a retryable write's number.
#[tokio::test]
async fn w10_starting_a_transaction_at_a_used_number_is_117_without_a_label() {
    bounded(async {
        for role in ["primary", "mongos"] {
            let (server, mut client) = if role == "primary" {
                start_primary().await
            } else {
                start(Role::Mongos).await
            };
            let insert = |id: i32, txn: i64, start: bool| {
                let mut command = doc! {
                    "insert": "c", "documents": [{ "_id": id }], "$db": "test",
                    "lsid": lsid(), "txnNumber": txn, "autocommit": false,
                };
                if start {
                    command.insert("startTransaction", true);
                }
                command
            };
            let reply = client.command(insert(1, 1, true)).await.unwrap();
            assert_eq!(code(&reply), None, "{role}: {reply}");
            let again = client.command(insert(2, 1, true)).await.unwrap();
            assert_eq!(code(&again), Some(117), "{role} in progress: {again}");
            assert!(!again.contains_key("errorLabels"), "{role}: {again}");
            if role == "mongos" {
                assert!(
                    errmsg(&again).starts_with("txnNumber 1 for session "),
                    "{again}"
                );
                assert!(errmsg(&again).ends_with(" already started"), "{again}");
            } else {
                assert_eq!(
                    errmsg(&again),
                    "Only servers in a sharded cluster can start a new transaction at the active \
                     transaction number"
                );
            }
            let commit = doc! {
                "commitTransaction": 1, "$db": "admin", "lsid": lsid(), "txnNumber": 1_i64,
                "autocommit": false,
            };
            let reply = client.command(commit).await.unwrap();
            assert_eq!(
                code(&reply),
                None,
                "{role}: the transaction went on: {reply}"
            );
            let after_commit = client.command(insert(3, 1, true)).await.unwrap();
            assert_eq!(
                code(&after_commit),
                Some(117),
                "{role} committed: {after_commit}"
            );
            assert!(!after_commit.contains_key("errorLabels"));

            let retryable = doc! {
                "insert": "c", "documents": [{ "_id": 4 }], "$db": "test",
                "lsid": lsid(), "txnNumber": 2_i64,
            };
            let reply = client.command(retryable).await.unwrap();
            assert_eq!(code(&reply), None, "{role}: {reply}");
            let reused = client.command(insert(5, 2, true)).await.unwrap();
            assert_eq!(
                code(&reused),
                Some(117),
                "{role} retryable write's: {reused}"
            );
            let next = client.command(insert(6, 3, true)).await.unwrap();
            assert_eq!(code(&next), None, "{role}: a new number starts: {next}");
            server.shutdown().await;
        }
    })
    .await;
}

/// Review37 W11 (SS-8, SS-9; src/mongo/db/commands/list_databases.cpp: opt-in on a secondary):
/// a secondary answers `listDatabases` only with a non-primary `$readPreference`, else
/// NotPrimaryNoSecondaryOk (13435).
#[tokio::test]
async fn w11_a_secondary_runs_list_databases_only_with_secondary_ok() {
    bounded(async {
        let members = TestServer::start_replica_set("rs0", 2, ServerConfig::default())
            .await
            .expect("replica set starts");
        let mut secondary = RawClient::connect(members[1].address()).await.unwrap();
        let list = doc! { "listDatabases": 1, "$db": "admin" };
        let reply = secondary.command(list.clone()).await.unwrap();
        assert_eq!(code(&reply), Some(13435), "{reply}");
        let mut allowed = list;
        allowed.insert("$readPreference", doc! { "mode": "primaryPreferred" });
        let reply = secondary.command(allowed).await.unwrap();
        assert_eq!(code(&reply), None, "{reply}");
        for member in members {
            member.shutdown().await;
        }
    })
    .await;
}
