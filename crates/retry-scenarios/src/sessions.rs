//! Scenarios of what the client sends, checked at retry-testkit: sessions (SE-*, RW-6, RW-7), read
//! preference on a secondary (SS-9), `maxTimeMS` (CS-4) and `socketTimeoutMS` (TO-3). The test
//! server refuses what a real one refuses (a `txnNumber` without `lsid`, a secondary read without
//! a secondaryOk `$readPreference`), so a pass shows a real server would accept it too.

use std::time::Duration;

use bson::{doc, Bson, Document};
use retry_core::engine::{CommandEvent, EngineEvent};
use retry_core::error::{ErrorKind, NetworkErrorKind};
use retry_core::retry::OperationKind;
use retry_core::selection::{ReadPreference, ReadPreferenceMode, SelectionCriteria};
use retry_core::time::Instant;
use retry_driver::{Client, CommandOptions, Runtime};
use retry_testkit::{FailCommand, FailPointMode, Role, ServerConfig, TestServer};

use super::{bounded, connect, options, overload, servers_runtime, Server, SCENARIO_LIMIT};

/// A replica set of `members` test servers sharing one store, the first the primary.
async fn replica_set(members: usize) -> Vec<Server> {
    replica_set_with(members, ServerConfig::default()).await
}

/// A replica set `rs0` of `members` servers started with `config`, the first the primary.
pub(crate) async fn replica_set_with(members: usize, config: ServerConfig) -> Vec<Server> {
    let servers = servers_runtime()
        .spawn(TestServer::start_replica_set("rs0", members, config))
        .await
        .expect("the servers task")
        .expect("the replica set starts");
    servers
        .into_iter()
        .map(|server| Server {
            handle: server.handle(),
            address: server.address(),
            server: Some(server),
        })
        .collect()
}

/// The commands named `name` the client wrote, with the server each went to (EV-2).
fn started(events: &[(Instant, EngineEvent)], name: &str) -> Vec<(String, Document)> {
    events
        .iter()
        .filter_map(|(_, e)| match e {
            EngineEvent::Command(event) => match &**event {
                CommandEvent::Started { info, command } if info.command_name == name => {
                    Some((info.address.to_string(), command.clone()))
                }
                _ => None,
            },
            _ => None,
        })
        .collect()
}

fn insert_one() -> Document {
    doc! { "insert": "c", "documents": [{ "x": 1 }] }
}

/// RW-6, RW-7, TK-11: an insert with no session of the caller's, whose first attempt commits and
/// then loses its connection, is retried with the same `lsid` and `txnNumber`; the server
/// recognises the retry and the insert ran once.
pub async fn retried_insert_runs_once_with_one_lsid_and_txn_number<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let members = replica_set(1).await;
        let client: Client<R> = connect(options(&[&members[0]]));
        let mut events = client.events();
        client
            .run_command(
                "admin",
                doc! { "configureFailPoint": "onPrimaryTransactionalWrite",
                "mode": { "times": 1 }, "data": { "closeConnection": true } },
                OperationKind::RunCommand,
            )
            .await
            .expect("the fail point is set");
        client
            .run_command("test", insert_one(), OperationKind::RetryableWrite)
            .await
            .expect("the retry gets the first reply");
        let inserts = started(&events.drain(), "insert");
        assert_eq!(inserts.len(), 2, "one retry");
        let (first, retry) = (&inserts[0].1, &inserts[1].1);
        assert!(first.get_document("lsid").is_ok(), "{first}");
        assert_eq!(first.get("lsid"), retry.get("lsid"), "RW-7");
        assert_eq!(first.get("txnNumber"), Some(&Bson::Int64(1)), "RW-6");
        assert_eq!(retry.get("txnNumber"), Some(&Bson::Int64(1)), "RW-7");
        let counts = members[0].handle.counters().command("insert");
        assert_eq!((counts.received, counts.executed), (2, 1));
        assert_eq!(counts.replayed, 1, "the retry was recognised");
        assert_eq!(members[0].handle.documents("test.c").len(), 1);
        client.shutdown().await;
        for member in members {
            member.stop().await;
        }
    })
    .await
}

/// SS-9, SE-13: with `readPreference=secondary` a read reaches a secondary carrying
/// `$readPreference` and an `lsid` (the test server's secondary refuses a read without a
/// secondaryOk read preference, as a real one does).
pub async fn secondary_read_carries_read_preference_and_lsid<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let members = replica_set(2).await;
        let mut options = options(&[&members[0], &members[1]]);
        options.read_preference = ReadPreference::from_mode(ReadPreferenceMode::Secondary);
        let client: Client<R> = connect(options);
        let mut events = client.events();
        client
            .run_command("test", doc! { "find": "c" }, OperationKind::Read)
            .await
            .expect("the secondary serves it");
        let finds = started(&events.drain(), "find");
        assert_eq!(finds.len(), 1);
        let (address, command) = &finds[0];
        assert_eq!(*address, members[1].address.to_string(), "the secondary");
        assert_eq!(
            command.get_document("$readPreference").ok(),
            Some(&doc! { "mode": "secondary" })
        );
        assert!(command.get_document("lsid").is_ok(), "{command}");
        let counts = members[1].handle.counters().command("find");
        assert_eq!((counts.executed, counts.succeeded), (1, 1));
        client.shutdown().await;
        for member in members {
            member.stop().await;
        }
    })
    .await
}

/// SS-10 (run-command spec "ReadPreference"): a generic command ignores the client's
/// `readPreference=secondary` and goes to the primary, without `$readPreference`, unless the
/// caller passes one; a read still honours the client's (SS-2).
pub async fn ss10_a_generic_command_ignores_the_client_read_preference<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let members = replica_set(2).await;
        let mut options = options(&[&members[0], &members[1]]);
        let secondary = ReadPreference::from_mode(ReadPreferenceMode::Secondary);
        options.read_preference = secondary.clone();
        let client: Client<R> = connect(options);
        let mut events = client.events();
        // Client::command classifies `ping` as a generic command.
        client
            .command("admin", doc! { "ping": 1 })
            .await
            .expect("the primary answers");
        client
            .run_command("admin", doc! { "ping": 1 }, OperationKind::RunCommand)
            .await
            .expect("the primary answers");
        client
            .run_command_encoded(
                "admin",
                bson::rawdoc! { "ping": 1 },
                OperationKind::RunCommand,
            )
            .await
            .expect("the primary answers");
        let explicit = CommandOptions::default().with_criteria(SelectionCriteria::Read(secondary));
        client
            .run(
                "admin",
                doc! { "ping": 1 },
                OperationKind::RunCommand,
                explicit,
            )
            .await
            .expect("the secondary answers");
        client
            .run_command("test", doc! { "find": "c" }, OperationKind::Read)
            .await
            .expect("the secondary serves it");
        let events = events.drain();
        let pings = started(&events, "ping");
        assert_eq!(pings.len(), 4, "{pings:?}");
        for (address, command) in &pings[..3] {
            assert_eq!(*address, members[0].address.to_string(), "the primary");
            assert!(command.get("$readPreference").is_none(), "{command}");
        }
        let (address, command) = &pings[3];
        assert_eq!(
            *address,
            members[1].address.to_string(),
            "an explicit secondary"
        );
        assert_eq!(
            command.get_document("$readPreference").ok(),
            Some(&doc! { "mode": "secondary" })
        );
        let finds = started(&events, "find");
        assert_eq!(finds.len(), 1);
        assert_eq!(finds[0].0, members[1].address.to_string(), "the secondary");
        client.shutdown().await;
        for member in members {
            member.stop().await;
        }
    })
    .await
}

/// CS-4: under `timeoutMS` every attempt carries a `maxTimeMS` of at most the time left.
pub async fn max_time_ms_is_on_every_attempt_under_timeout_ms<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let server = Server::with_role(Role::Mongos).await;
        server
            .handle
            .set_fail_command(Some(overload(FailPointMode::Times(2), &["find"])));
        let mut options = options(&[&server]);
        options.timeout = Some(Duration::from_secs(10));
        let client: Client<R> = connect(options);
        let mut events = client.events();
        client
            .run_command("test", doc! { "find": "c" }, OperationKind::Read)
            .await
            .expect("the third attempt succeeds");
        let finds = started(&events.drain(), "find");
        assert_eq!(finds.len(), 3);
        let mut previous = i32::MAX;
        for (_, find) in &finds {
            let max_time = match find.get("maxTimeMS") {
                Some(Bson::Int32(ms)) => *ms,
                other => panic!("no maxTimeMS: {other:?} in {find}"),
            };
            assert!(max_time > 0 && max_time <= 10_000, "{max_time}");
            assert!(max_time <= previous, "the time left only shrinks");
            previous = max_time;
        }
        client.shutdown().await;
        server.stop().await;
    })
    .await
}

/// TO-1, TO-3, RR-2: without `timeoutMS`, `socketTimeoutMS` bounds a server that accepts a command
/// and never answers: the connection closes with a network timeout error, the read is retried
/// once, and the operation fails with that error.
pub async fn socket_timeout_bounds_a_server_that_never_answers<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let server = Server::with_role(Role::Mongos).await;
        let mut options = options(&[&server]);
        options.socket_timeout = Some(Duration::from_millis(200));
        let client: Client<R> = connect(options);
        client
            .run_command("admin", doc! { "ping": 1 }, OperationKind::RunCommand)
            .await
            .expect("ping");
        server.handle.set_fail_command(Some(
            FailCommand::new(FailPointMode::AlwaysOn, ["find"]).with_block(Duration::from_secs(3)),
        ));
        let error = client
            .run(
                "test",
                doc! { "find": "c" },
                OperationKind::Read,
                CommandOptions::default()
                    .with_criteria(SelectionCriteria::Read(ReadPreference::PRIMARY)),
            )
            .await
            .expect_err("never answered");
        match &error.kind {
            ErrorKind::Network(n) => assert_eq!(n.kind, NetworkErrorKind::Timeout, "{error}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(server.handle.counters().command("find").received, 2);
        server.handle.set_fail_command(None);
        client.shutdown().await;
        server.stop().await;
    })
    .await
}

/// SE-10: an explicit session runs several operations with one `lsid` and increasing
/// `txnNumber`s; dropping it returns its server session to the pool, so the next implicit
/// operation reuses it (SE-5) with the next number (RW-6).
pub async fn explicit_session_runs_several_operations<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let members = replica_set(1).await;
        let client: Client<R> = connect(options(&[&members[0]]));
        let mut events = client.events();
        let session = client.start_session().await.expect("a session");
        for _ in 0..2 {
            session
                .run_command("test", insert_one(), OperationKind::RetryableWrite)
                .await
                .expect("insert");
        }
        drop(session);
        client
            .run_command("test", insert_one(), OperationKind::RetryableWrite)
            .await
            .expect("insert");
        let inserts = started(&events.drain(), "insert");
        let lsids: Vec<_> = inserts.iter().map(|(_, c)| c.get("lsid")).collect();
        let numbers: Vec<_> = inserts.iter().map(|(_, c)| c.get("txnNumber")).collect();
        assert!(lsids[0].is_some());
        assert!(lsids.iter().all(|l| *l == lsids[0]), "{lsids:?}");
        assert_eq!(
            numbers,
            [1_i64, 2, 3]
                .map(|n| Some(Bson::Int64(n)))
                .each_ref()
                .map(Option::as_ref)
        );
        client.shutdown().await;
        assert_eq!(
            members[0].handle.counters().command("endSessions").executed,
            1,
            "SE-15"
        );
        for member in members {
            member.stop().await;
        }
    })
    .await
}

/// Review item 2 (read-write-concern spec, URI options, SE-13): the client's `w=0` and
/// `readConcernLevel` reach the commands [`Client::command`] and [`Client::cursor`] build: the
/// insert goes out unacknowledged and without an implicit `lsid`, the reads carry
/// `readConcern {level}`; [`Client::run_command`] sends its command as given.
pub async fn client_concerns_reach_command_and_cursor<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let members = replica_set(1).await;
        let mut options = options(&[&members[0]]);
        options.write_concern = Some(doc! { "w": 0 });
        options.read_concern_level = Some("majority".into());
        let client: Client<R> = connect(options);
        let mut events = client.events();
        client
            .command("test", insert_one())
            .await
            .expect("the w:0 insert");
        client
            .run_command("test", insert_one(), OperationKind::RetryableWrite)
            .await
            .expect("the generic insert");
        client
            .command("test", doc! { "find": "c" })
            .await
            .expect("the find");
        drop(
            client
                .cursor("test", doc! { "find": "c" })
                .await
                .expect("a cursor"),
        );
        let events = events.drain();
        let inserts = started(&events, "insert");
        assert_eq!(inserts.len(), 2);
        let (inherited, generic) = (&inserts[0].1, &inserts[1].1);
        assert_eq!(
            inherited.get_document("writeConcern").ok(),
            Some(&doc! { "w": 0 })
        );
        assert!(!inherited.contains_key("lsid"), "SE-13: {inherited}");
        assert!(!generic.contains_key("writeConcern"), "{generic}");
        assert!(generic.contains_key("lsid"), "{generic}");
        let finds = started(&events, "find");
        assert_eq!(finds.len(), 2);
        for (_, find) in &finds {
            assert_eq!(
                find.get_document("readConcern").ok(),
                Some(&doc! { "level": "majority" }),
                "{find}"
            );
        }
        client.shutdown().await;
        for member in members {
            member.stop().await;
        }
    })
    .await
}

/// TX-2: ending a session whose transaction is in progress aborts the transaction first, with the
/// session's `lsid`, the transaction's `txnNumber` and `autocommit: false` (TX-1); the session
/// then ends.
pub async fn ending_a_session_aborts_its_transaction<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let members = replica_set(1).await;
        let client: Client<R> = connect(options(&[&members[0]]));
        let mut events = client.events();
        let session = client.start_session().await.expect("a session");
        session.start_transaction().await.expect("a transaction");
        session
            .run_command("test", insert_one(), OperationKind::RetryableWrite)
            .await
            .expect("insert in the transaction");
        drop(session);
        let mut seen = Vec::new();
        for _ in 0..1_000 {
            seen.extend(events.drain());
            if !started(&seen, "abortTransaction").is_empty() {
                break;
            }
            client
                .run_command("admin", doc! { "ping": 1 }, OperationKind::RunCommand)
                .await
                .expect("ping");
        }
        let inserts = started(&seen, "insert");
        let aborts = started(&seen, "abortTransaction");
        assert_eq!(aborts.len(), 1, "TX-2: one abortTransaction");
        let (insert, abort) = (&inserts[0].1, &aborts[0].1);
        assert_eq!(abort.get("lsid"), insert.get("lsid"));
        assert_eq!(abort.get("txnNumber"), insert.get("txnNumber"));
        assert_eq!(abort.get("autocommit"), Some(&Bson::Boolean(false)));
        client.shutdown().await;
        for member in members {
            member.stop().await;
        }
    })
    .await
}

/// TX-1, TX-11 (review5 item 9): an explicit session inherits the client's concerns
/// (`w: majority`, `readConcernLevel: majority`): outside a transaction its write carries the
/// `writeConcern`; inside one the first command carries the `readConcern` level and no
/// `writeConcern`, the second neither, and `commitTransaction` the `writeConcern`. The test server
/// refuses a `writeConcern` on a statement and a `readConcern` after the first command, as a
/// real one does.
pub async fn sessions_and_transactions_inherit_the_client_concerns<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let members = replica_set(1).await;
        let mut options = options(&[&members[0]]);
        options.write_concern = Some(doc! { "w": "majority" });
        options.read_concern_level = Some("majority".into());
        let client: Client<R> = connect(options);
        let mut events = client.events();
        let session = client.start_session().await.expect("a session");
        session
            .command("test", insert_one())
            .await
            .expect("the insert outside a transaction");
        session.start_transaction().await.expect("a transaction");
        for _ in 0..2 {
            session
                .command("test", insert_one())
                .await
                .expect("an insert in the transaction");
        }
        session.commit_transaction().await.expect("the commit");
        let events = events.drain();
        let inserts = started(&events, "insert");
        assert_eq!(inserts.len(), 3);
        let majority = doc! { "w": "majority" };
        let (plain, first, second) = (&inserts[0].1, &inserts[1].1, &inserts[2].1);
        assert_eq!(plain.get_document("writeConcern").ok(), Some(&majority));
        assert!(!first.contains_key("writeConcern"), "TX-1: {first}");
        let read_concern = first
            .get_document("readConcern")
            .expect("TX-1: readConcern");
        assert_eq!(
            read_concern.get_str("level").ok(),
            Some("majority"),
            "{first}"
        );
        assert!(!second.contains_key("writeConcern"), "TX-1: {second}");
        assert!(!second.contains_key("readConcern"), "TX-1: {second}");
        let commits = started(&events, "commitTransaction");
        assert_eq!(commits.len(), 1);
        assert_eq!(
            commits[0].1.get_document("writeConcern").ok(),
            Some(&majority),
            "TX-11: the transaction's write concern"
        );
        drop(session);
        client.shutdown().await;
        for member in members {
            member.stop().await;
        }
    })
    .await
}

/// SE-21 (review5 item 11): a causally consistent session's second read carries
/// `readConcern.afterClusterTime` equal to the `operationTime` of the previous reply, which the
/// test server's logical clock gives as a replica-set member does.
pub async fn a_sessions_second_read_is_after_the_previous_operation_time<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let members = replica_set(1).await;
        let client: Client<R> = connect(options(&[&members[0]]));
        let mut events = client.events();
        let session = client.start_session().await.expect("a session");
        let first = session
            .command("test", doc! { "find": "c" })
            .await
            .expect("the first read");
        let written = session
            .command("test", insert_one())
            .await
            .expect("the insert");
        session
            .command("test", doc! { "find": "c" })
            .await
            .expect("the second read");
        let events = events.drain();
        let finds = started(&events, "find");
        assert_eq!(finds.len(), 2);
        assert!(
            first.get_timestamp("operationTime").is_ok(),
            "the test server gives operationTime: {first}"
        );
        assert!(
            !finds[0].1.contains_key("readConcern"),
            "SE-21: nothing to be after yet: {}",
            finds[0].1
        );
        let after = finds[1]
            .1
            .get_document("readConcern")
            .and_then(|rc| rc.get_timestamp("afterClusterTime"))
            .expect("SE-21: afterClusterTime");
        assert_eq!(Some(after), written.get_timestamp("operationTime").ok());
        let before = first.get_timestamp("operationTime").expect("a time");
        assert!(
            (after.time, after.increment) > (before.time, before.increment),
            "the insert moved the clock"
        );
        drop(session);
        client.shutdown().await;
        for member in members {
            member.stop().await;
        }
    })
    .await
}
