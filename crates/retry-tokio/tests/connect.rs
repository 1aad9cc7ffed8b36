//! Creating a client: bad URIs and settings are errors, never panics.

use retry_tokio::{Client, ConnectError};

#[tokio::test]
async fn bad_uris_name_the_option_and_the_value() {
    // A malformed escape is an error of the URI (URI-2).
    let error = Client::with_uri("mongodb://127.0.0.1/?appName=%ZZ").unwrap_err();
    let ConnectError::Options(options) = &error else {
        panic!("{error:?}")
    };
    assert_eq!(options.option(), "appName");
    assert!(error.to_string().contains("appName"), "{error}");
    // An invalid value is a warning and the option is ignored (URI-7): the warning names both.
    let options =
        retry_tokio::ClientOptions::parse("mongodb://127.0.0.1/?serverSelectionTimeoutMS=soon")
            .unwrap();
    assert!(
        options
            .warnings
            .iter()
            .any(|w| w.contains("serverSelectionTimeoutMS") && w.contains("soon")),
        "{:?}",
        options.warnings
    );
}

#[tokio::test]
async fn settings_that_contradict_the_hosts_are_errors() {
    // URI-11: directConnection=true and loadBalanced=true each need exactly one host.
    for (uri, option) in [
        (
            "mongodb://127.0.0.1:1,127.0.0.1:2/?directConnection=true",
            "directConnection",
        ),
        (
            "mongodb://127.0.0.1:1,127.0.0.1:2/?loadBalanced=true",
            "loadBalanced",
        ),
    ] {
        let error = Client::with_uri(uri).unwrap_err();
        // Review32 R16: named by the option and its value, not as "uri" "".
        let ConnectError::Options(options) = &error else {
            panic!("{error:?}")
        };
        assert_eq!((options.option(), options.value()), (option, "true"));
        assert!(error.to_string().contains(option), "{uri}: {error}");
    }
}

/// Review32 R1 (URI-7, house rule 11): `with_uri` and `with_uri_async` refuse a URI with
/// anything `ClientOptions::parse` would ignore with a warning, naming the option; `parse` and
/// `connect` still accept it, the warning kept for the caller.
#[tokio::test]
async fn review32_r1_with_uri_refuses_what_parse_would_ignore_with_a_warning() {
    for (query, option) in [
        ("bogus=1", "bogus"),
        ("maxAdaptiveRetries=-1", "maxAdaptiveRetries"),
        ("timeoutMS=-5", "timeoutMS"),
        ("compressors=zlib", "compressors"),
    ] {
        let uri = format!("mongodb://127.0.0.1:1/?{query}");
        let errors = [
            Client::with_uri(&uri).unwrap_err(),
            Client::with_uri_async(&uri).await.unwrap_err(),
        ];
        for error in errors {
            let ConnectError::Options(options) = &error else {
                panic!("{uri}: {error:?}")
            };
            assert_eq!(options.option(), option, "{uri}: {error}");
        }
        let options = retry_tokio::ClientOptions::parse(&uri).unwrap();
        assert_eq!(options.warnings.len(), 1, "{uri}: {:?}", options.warnings);
        Client::connect(options).unwrap().shutdown().await;
    }
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
