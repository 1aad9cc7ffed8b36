//! WP-6, EV-4, RW-4 end to end: a client with `w: 0` on tokio against a retry-testkit server
//! (which, as a real server, sends nothing back for a `moreToCome` request). The unacknowledged
//! insert finishes with `{ok: 1}` without a reply, the write lands, and the next acknowledged
//! `find` on the same connection sees it. Only 127.0.0.1; bounded by the scenario limit.

use bson::{doc, Bson, Document};
use retry_core::engine::{CommandEvent, EngineEvent};
use retry_core::retry::OperationKind;
use retry_core::time::Instant;
use retry_scenarios::{bounded, options, Server, SCENARIO_LIMIT};
use retry_testkit::Role;
use retry_tokio::Client;

/// The command events of the commands named `name`, in order: started (with its command) or
/// succeeded (with its reply), and the connection each was on.
fn command_events(events: &[(Instant, EngineEvent)], name: &str) -> Vec<(bool, Document, u64)> {
    events
        .iter()
        .filter_map(|(_, e)| match e {
            EngineEvent::Command(event) => match &**event {
                CommandEvent::Started { info, command } if info.command_name == name => {
                    Some((true, command.clone(), info.connection.0))
                }
                CommandEvent::Succeeded { info, reply, .. } if info.command_name == name => {
                    Some((false, reply.clone(), info.connection.0))
                }
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// WP-6, EV-4, RW-4: the client's `w: 0` insert ends with `{ok: 1}` (its succeeded event too,
/// no `n`), carries its write concern and no `txnNumber` or `lsid`; the server stored the
/// document, and the acknowledged `find` that follows on the same connection returns it.
#[tokio::test]
async fn wp6_ev4_an_unacknowledged_insert_lands_and_the_next_find_sees_it() {
    bounded(SCENARIO_LIMIT, async {
        let server = Server::with_role(Role::Standalone).await;
        let mut options = options(&[&server]);
        options.write_concern = Some(doc! { "w": 0 });
        let client = Client::connect(options).expect("the client starts");
        let mut events = client.events();
        let insert = doc! { "insert": "c", "documents": [{ "_id": 1, "x": 11 }] };
        assert_eq!(
            client.classify(&insert),
            OperationKind::NonRetryableWrite,
            "RW-4"
        );
        let reply = client
            .command("test", insert)
            .await
            .expect("the w:0 insert");
        assert_eq!(reply, doc! { "ok": 1 }, "EV-4: no n");
        let found = client
            .run_command(
                "test",
                doc! { "find": "c", "filter": { "_id": 1 } },
                OperationKind::Read,
            )
            .await
            .expect("the find");
        let batch = found
            .get_document("cursor")
            .and_then(|cursor| cursor.get_array("firstBatch"))
            .expect("a cursor");
        assert_eq!(
            batch,
            &vec![Bson::Document(doc! { "_id": 1, "x": 11 })],
            "the w:0 insert landed before the find ran"
        );
        let events = events.drain();
        let inserts = command_events(&events, "insert");
        assert_eq!(inserts.len(), 2, "started and succeeded: {inserts:?}");
        let (started, command, conn) = &inserts[0];
        assert!(*started);
        assert_eq!(
            command.get_document("writeConcern").ok(),
            Some(&doc! { "w": 0 })
        );
        assert!(!command.contains_key("txnNumber"), "RW-4: {command}");
        assert!(!command.contains_key("lsid"), "SE-13: {command}");
        assert_eq!(inserts[1], (false, doc! { "ok": 1 }, *conn), "EV-4");
        let finds = command_events(&events, "find");
        assert_eq!(
            finds[0].2, *conn,
            "the connection was checked in and reused"
        );
        client.shutdown().await;
        // The server received one insert and one find, and answered the find only.
        let counters = server.handle.counters();
        assert_eq!(counters.command("insert").received, 1);
        assert_eq!(counters.command("find").received, 1);
        server.stop().await;
    })
    .await
}
