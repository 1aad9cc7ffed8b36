//! Creating a client: bad URIs and settings are errors, never panics.

use retry_tokio::{Client, ConnectError};

#[tokio::test]
async fn bad_uris_name_the_option_and_the_value() {
    let error = Client::with_uri("mongodb://127.0.0.1/?serverSelectionTimeoutMS=soon").unwrap_err();
    let ConnectError::Options(options) = &error else {
        panic!("{error:?}")
    };
    assert_eq!(options.option(), "serverSelectionTimeoutMS");
    assert_eq!(options.value(), "soon");
    assert!(
        error.to_string().contains("serverSelectionTimeoutMS"),
        "{error}"
    );
}

#[tokio::test]
async fn settings_the_engine_refuses_are_errors() {
    let error =
        Client::with_uri("mongodb://127.0.0.1:1,127.0.0.1:2/?directConnection=true").unwrap_err();
    assert!(matches!(error, ConnectError::Settings(_)), "{error:?}");
    let error =
        Client::with_uri("mongodb://127.0.0.1:1,127.0.0.1:2/?loadBalanced=true").unwrap_err();
    assert!(matches!(error, ConnectError::Settings(_)), "{error:?}");
}

#[tokio::test]
async fn dropping_the_last_clone_shuts_the_client_down() {
    let client = Client::with_uri("mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=60000").unwrap();
    let clone = client.clone();
    let mut events = client.events();
    drop(client);
    // The clone keeps it alive: its operation runs (and waits for a server).
    let pending = tokio::spawn(async move {
        let result = clone
            .run_command(
                "admin",
                bson::doc! { "ping": 1 },
                retry_core::retry::OperationKind::RunCommand,
            )
            .await;
        drop(clone);
        result
    });
    // The ping waits for a server; aborting the task drops the last clone, which closes the
    // client: the event stream ends (bounded, so a client that stays open fails the test).
    pending.abort();
    assert!(pending.await.unwrap_err().is_cancelled());
    let drained = async { while events.next_event().await.is_some() {} };
    tokio::time::timeout(std::time::Duration::from_secs(30), drained)
        .await
        .expect("the event stream ended");
}
