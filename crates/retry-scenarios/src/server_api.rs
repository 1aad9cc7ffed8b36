//! The Stable API end to end (versioned-api spec) against a test server that requires an API
//! version (`requireApiVersion`, code 498870).

use std::time::Duration;

use bson::doc;
use retry_core::retry::OperationKind;
use retry_driver::{Runtime, ServerApi, ServerApiVersion};
use retry_testkit::ServerConfig;

use super::sessions::replica_set_with;
use super::{bounded, connect, options, SCENARIO_LIMIT};

/// Versioned-api spec ("Sending Declared API Version to the Server", "Cursors", "Transactions",
/// "Handshake behavior"): on a server that requires an API version, a client that declares none
/// cannot even connect (its hellos are refused with 498870), while one that declares version 1
/// runs writes, a cursor's `getMore`s, a transaction's statements and its commit; with
/// `strict`, a command outside API version 1 is APIStrictError (323) and one in it runs; and
/// `setParameter` turns the requirement off again for the client without a version.
pub async fn stable_api_declared_version_reaches_a_server_that_requires_one<R: Runtime>() {
    bounded(SCENARIO_LIMIT, async {
        let config = ServerConfig {
            require_api_version: true,
            batch_size: 2,
            ..ServerConfig::default()
        };
        let members = replica_set_with(1, config).await;
        let primary = &members[0];
        let client_with = |api: Option<ServerApi>| {
            let mut options = options(&[primary]);
            options.server_selection_timeout = Duration::from_millis(1500);
            options.server_api = api;
            connect::<R>(options)
        };

        let undeclared = client_with(None);
        let error = undeclared
            .run_command("admin", doc! { "ping": 1 }, OperationKind::RunCommand)
            .await
            .expect_err("no API version: every hello is refused");
        assert!(
            error
                .to_string()
                .contains("apiVersion parameter is required"),
            "498870 is the cause: {error}"
        );
        assert_eq!(primary.handle.counters().command("ping").received, 0);
        undeclared.shutdown().await;

        let v1 = ServerApi::new(ServerApiVersion::V1);
        let declared = client_with(Some(v1));
        let documents: Vec<_> = (0..5).map(|i| doc! { "_id": i }).collect();
        declared
            .run_command(
                "test",
                doc! { "insert": "items", "documents": documents },
                OperationKind::NonRetryableWrite,
            )
            .await
            .expect("an insert with apiVersion");
        let mut cursor = declared
            .cursor("test", doc! { "find": "items" })
            .await
            .expect("a find with apiVersion");
        let mut seen = 0;
        while cursor
            .next()
            .await
            .expect("getMore carries apiVersion")
            .is_some()
        {
            seen += 1;
        }
        assert_eq!(seen, 5);
        assert!(primary.handle.counters().command("getMore").received >= 2);
        let session = declared.start_session().await.expect("a session");
        session.start_transaction().await.expect("a transaction");
        session
            .command(
                "test",
                doc! { "insert": "items", "documents": [{ "_id": 5 }] },
            )
            .await
            .expect("a statement with apiVersion");
        session
            .commit_transaction()
            .await
            .expect("commitTransaction carries apiVersion");
        drop(session);
        assert_eq!(primary.handle.documents("test.items").len(), 6);

        let strict = client_with(Some(v1.with_strict(true)));
        let error = strict
            .run_command(
                "test",
                doc! { "distinct": "items", "key": "_id" },
                OperationKind::Read,
            )
            .await
            .expect_err("distinct is not in API version 1");
        assert_eq!(error.code(), Some(323), "APIStrictError: {error}");
        strict
            .run_command("test", doc! { "count": "items" }, OperationKind::Read)
            .await
            .expect("count is in API version 1");
        strict.shutdown().await;

        let was = declared
            .run_command(
                "admin",
                doc! { "setParameter": 1, "requireApiVersion": false },
                OperationKind::RunCommand,
            )
            .await
            .expect("setParameter with apiVersion");
        assert_eq!(was.get_bool("was").ok(), Some(true), "{was}");
        declared.shutdown().await;
        let undeclared = client_with(None);
        undeclared
            .run_command("admin", doc! { "ping": 1 }, OperationKind::RunCommand)
            .await
            .expect("no longer required");
        undeclared.shutdown().await;
        for member in members {
            member.stop().await;
        }
    })
    .await
}
