//! The clock comes from tokio, so paused time drives the engine's timers.

use core::future::poll_fn;
use core::task::Poll;
use std::time::Duration;

use bson::doc;
use retry_core::error::ErrorClass;
use retry_core::retry::OperationKind;
use retry_core::time::Instant;
use retry_driver::Runtime;
use retry_tokio::{Client, ClientOptions, ConnectError, TokioRuntime};

/// Whether the timer fires on this poll.
async fn fired(timer: &mut core::pin::Pin<Box<dyn retry_driver::AsyncTimer>>) -> bool {
    poll_fn(|cx| Poll::Ready(timer.as_mut().poll(cx).is_ready())).await
}

#[tokio::test(start_paused = true)]
async fn the_clock_and_timers_follow_tokios_paused_clock() {
    let runtime = TokioRuntime::start().unwrap();
    assert_eq!(runtime.now(), Instant::ZERO);
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(runtime.now(), Instant::from_millis(5_000));

    let mut timer = runtime.new_timer(Instant::from_millis(5_100));
    assert!(!fired(&mut timer).await);
    tokio::time::advance(Duration::from_millis(100)).await;
    assert!(fired(&mut timer).await);

    timer.as_mut().reset(Instant::from_millis(3_605_100));
    assert!(!fired(&mut timer).await);
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert!(fired(&mut timer).await);
    // "Never" is far away, not an overflow.
    timer.as_mut().reset(Instant::MAX);
    assert!(!fired(&mut timer).await);
}

#[tokio::test(start_paused = true)]
async fn server_selection_times_out_in_virtual_time() {
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let options = ClientOptions::parse(&format!(
        "mongodb://127.0.0.1:{port}/?serverSelectionTimeoutMS=30000"
    ))
    .unwrap();
    let start = tokio::time::Instant::now();
    let client = Client::connect(options).unwrap();
    let error = client
        .run_command("admin", doc! { "ping": 1 }, OperationKind::RunCommand)
        .await
        .unwrap_err();
    assert_eq!(
        error.summary().class,
        ErrorClass::ServerSelection,
        "{error}"
    );
    // Virtual time: the paused clock went through the whole selection timeout.
    assert!(start.elapsed() >= Duration::from_secs(30));
    client.shutdown().await;
}

#[test]
fn connect_outside_a_tokio_runtime_is_an_error() {
    let options = ClientOptions::parse("mongodb://127.0.0.1:27017").unwrap();
    let error = Client::connect(options).unwrap_err();
    assert!(matches!(error, ConnectError::Runtime(_)), "{error}");
}
